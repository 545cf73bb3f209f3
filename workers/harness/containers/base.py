"""The base image made here: Debian bookworm by debootstrap from this machine's apt sources.

The root filesystem gets python3 and pip (the public python image's contract: `python` and `pip`
on PATH, pip installs system-wide), this machine's apt sources, its extra certificate authorities
and its pip configuration, so that builds on it reach Debian's and Python's package repositories
exactly as the host does. It is imported with `docker import` as `fanout-base:bookworm-<key>`,
the key a hash of everything it is made from (a run with the same inputs reuses it), and tagged
`fanout-base:bookworm`, the name docker-compose.debian.yml builds on. It carries this machine's
trust and settings and is for this machine only.
"""

from __future__ import annotations

import configparser
import hashlib
import io
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workers.harness.containers.commands import StepFailed, docker, run, run_logged

SUITE = "bookworm"
BASE_NAME = "fanout-base"
#: What the stack's images need of the base beyond debootstrap's minimal variant.
PACKAGES = ("python3", "python3-pip", "python-is-python3", "ca-certificates")
#: Bumped when the way the base is made changes (it is part of the content key).
RECIPE = "3"
#: Documentation, manuals and translations stay out of the base and of what images install on it.
DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/info/*
"""
#: apt in an image: no recommends, no downloaded packages or package caches left in a layer (as
#: Debian's own container images do).
APT_CLEAN = """\
APT::Install-Recommends "false";
APT::Install-Suggests "false";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""
#: debootstrap's lines shown as progress (the rest goes to the log).
BOOTSTRAP_PROGRESS = ("I: Retrieving InRelease", "I: Installing core packages", "I: Base system installed")
#: Host pip settings that name paths of the host (meaningless inside an image).
HOST_ONLY_PIP_KEYS = ("constraint", "find-links", "requirement", "log")
#: Environment variables of pip's network settings carried into the base's /etc/pip.conf.
PIP_NETWORK_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT",
                   "PIP_TIMEOUT", "PIP_RETRIES", "PIP_PROXY")  # fmt: skip


@dataclass(frozen=True)
class HostSettings:
    """What the base takes from this machine: its Debian mirror and apt sources, its extra
    certificate authorities and its pip configuration."""

    mirror: str
    sources: dict[str, str]
    authorities: dict[str, bytes]
    pip_conf: str

    def key(self) -> str:
        digest = hashlib.sha256(f"{RECIPE}\n{SUITE}\n{PACKAGES}\n{self.mirror}\n{self.pip_conf}".encode())
        for name, text in sorted(self.sources.items()):
            digest.update(f"{name}\n{text}".encode())
        for name, data in sorted(self.authorities.items()):
            digest.update(name.encode() + data)
        return digest.hexdigest()[:12]


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if fields:
            stanzas.append(fields)
    return stanzas


def host_settings(apt_dir: Path = Path("/etc/apt")) -> HostSettings:
    """Read this machine's Debian sources (one-line and deb822, enabled files only), extra
    certificate authorities and pip configuration. No Debian source raises `StepFailed`."""
    sources: dict[str, str] = {}
    mirror = ""
    one_line = apt_dir / "sources.list"
    if one_line.exists():
        lines = [ln for ln in one_line.read_text().splitlines() if ln.strip().startswith("deb ")]
        debian = [ln for ln in lines if f" {SUITE}" in ln and "debian" in ln]
        if debian:
            sources["sources.list"] = "\n".join(debian) + "\n"
            for line in debian:
                words = [w for w in line.split() if not w.startswith("[") and not w.endswith("]")]
                if len(words) > 2 and words[2] == SUITE and not mirror:
                    mirror = words[1]
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        text = path.read_text()
        stanzas = _deb822_stanzas(text)
        if not any(SUITE in s.get("suites", "").split() for s in stanzas):
            continue
        if not all("debian" in s.get("uris", "") for s in stanzas):
            continue  # only Debian's own repositories go into the base
        sources[path.name] = text
        for stanza in stanzas:
            if SUITE in stanza.get("suites", "").split() and not mirror:
                mirror = stanza["uris"].split()[0]
    if not mirror:
        raise StepFailed(f"no Debian {SUITE} source in {apt_dir}/sources.list(.d) for debootstrap")
    authorities = {
        path.name: path.read_bytes()
        for path in sorted(Path("/usr/local/share/ca-certificates").rglob("*.crt"))
    }
    return HostSettings(mirror, sources, authorities, _pip_conf())


def _pip_conf() -> str:
    """This machine's pip settings (/etc/pip.conf, /etc/xdg/pip/pip.conf, the PIP_* network
    variables) less those that name host paths, as one pip.conf."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(["/etc/xdg/pip/pip.conf", "/etc/pip.conf"])
    for section in config.sections():
        for key in HOST_ONLY_PIP_KEYS:
            config.remove_option(section, key)
    for name in PIP_NETWORK_ENV:
        if os.environ.get(name):
            if not config.has_section("global"):
                config.add_section("global")
            config.set("global", name.removeprefix("PIP_").lower().replace("_", "-"), os.environ[name])
    out = io.StringIO()
    config.write(out)
    return out.getvalue()


@dataclass(frozen=True)
class Base:
    tag: str
    seconds: float
    size_bytes: int
    cached: bool
    mirror: str


def image_exists(tag: str) -> bool:
    return run(["docker", "image", "inspect", tag], check=False, timeout=30).returncode == 0


def image_size(tag: str) -> int:
    return int(docker("image", "inspect", "-f", "{{.Size}}", tag))


def make_base(log: Path, workroot: Path = Path("/var/tmp")) -> Base:
    """The base for this machine's settings: reused when an image with its key exists, else made
    (debootstrap takes about a minute); either way tagged `fanout-base:bookworm`."""
    settings = host_settings()
    tag = f"{BASE_NAME}:{SUITE}-{settings.key()}"
    started = time.monotonic()
    cached = image_exists(tag)
    if not cached:
        if shutil.which("debootstrap") is None:
            raise StepFailed("debootstrap is not installed (make debootstrap installs it, as root)")
        if os.geteuid() != 0:
            raise StepFailed("debootstrap takes root")
        rootfs = Path(tempfile.mkdtemp(prefix="fanout-rootfs-", dir=workroot))
        try:
            _bootstrap(rootfs, settings, log)
            _import(rootfs, tag, log)
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
    docker("tag", tag, f"{BASE_NAME}:{SUITE}")
    return Base(tag, time.monotonic() - started, image_size(tag), cached, settings.mirror)


def _bootstrap(rootfs: Path, settings: HostSettings, log: Path) -> None:
    run_logged(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs),
         settings.mirror],
        log, progress=lambda line: line.startswith(BOOTSTRAP_PROGRESS),
    )  # fmt: skip
    etc = rootfs / "etc"
    (etc / "dpkg" / "dpkg.cfg.d" / "container-excludes").write_text(DPKG_EXCLUDES)
    (etc / "apt" / "apt.conf.d" / "container-clean").write_text(APT_CLEAN)
    (etc / "apt" / "sources.list").unlink(missing_ok=True)
    for name, text in settings.sources.items():
        target = etc / "apt" / name if name == "sources.list" else etc / "apt" / "sources.list.d" / name
        target.write_text(text)
    authorities = rootfs / "usr" / "local" / "share" / "ca-certificates"
    authorities.mkdir(parents=True, exist_ok=True)
    for name, data in settings.authorities.items():
        (authorities / name).write_bytes(data)
    if settings.authorities:
        with log.open("a") as out:
            command = ["chroot", str(rootfs), "update-ca-certificates"]
            subprocess.run(command, stdout=out, stderr=out, check=True)
    if settings.pip_conf.strip():
        (etc / "pip.conf").write_text(settings.pip_conf)
    # pip installs into the system's Python, as in the public image (no PEP 668 marker).
    for marker in (rootfs / "usr" / "lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for junk in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale",
                 "usr/share/info"):  # fmt: skip
        for child in (rootfs / junk).glob("*"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            elif child.name != "lock":
                child.unlink()
    (rootfs / "usr" / "share" / "man" / "man1").mkdir(parents=True, exist_ok=True)  # some postinsts need it


def _import(rootfs: Path, tag: str, log: Path) -> None:
    with log.open("a") as out:
        archive = ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."]
        tar = subprocess.Popen(archive, stdout=subprocess.PIPE, stderr=out)
        result = subprocess.run(
            ["docker", "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["bash"]', "-", tag],
            stdin=tar.stdout, stdout=out, stderr=out,
        )  # fmt: skip
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or result.returncode != 0:
            raise StepFailed(f"docker import of {rootfs} failed (the whole output: {log})")
