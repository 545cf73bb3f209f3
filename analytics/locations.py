"""Where the audit reads and writes: a local path or any URI Spark knows (`file://`, `hdfs://`, `s3a://`).

A location stays a string from the command line to Spark: `pathlib.Path("s3a://b/x")` would make
it `s3a:/b/x`. Spark writes and reads Parquet at any location; the few small files the audit
writes itself (summary, report, charts) are made in a local directory and, for a remote location,
copied there through Hadoop's FileSystem (the same credentials and settings Spark uses).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark.sql import SparkSession


def join(base: str, name: str) -> str:
    """`base/name`, for paths and URIs alike."""
    return f"{base.rstrip('/')}/{name}"


def local_path(location: str) -> Path | None:
    """The local directory or file `location` names (a plain path or `file://`), else None."""
    parts = urlsplit(location)
    if parts.scheme == "":
        return Path(location)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    return None


def exists(spark: SparkSession, location: str) -> bool:
    """Whether `location` exists, asking Hadoop's FileSystem for a remote one."""
    local = local_path(location)
    if local is not None:
        return local.exists()
    path = _hadoop_path(spark, location)
    return bool(path.getFileSystem(_hadoop_conf(spark)).exists(path))


def copy_files(spark: SparkSession, files: list[Path], location: str) -> list[str]:
    """Copy local `files` into the remote directory `location`; their new locations."""
    target_dir = _hadoop_path(spark, location)
    fs = target_dir.getFileSystem(_hadoop_conf(spark))
    fs.mkdirs(target_dir)
    copied = []
    for file in files:
        target = join(location, file.name)
        fs.copyFromLocalFile(False, True, _hadoop_path(spark, str(file)), _hadoop_path(spark, target))
        copied.append(target)
    return copied


def remove_partitions(spark: SparkSession, location: str, column: str, from_value: str) -> list[str]:
    """Delete the partition directories `column=value` directly under `location` whose value sorts at
    or after `from_value` (days as `YYYY-MM-DD` sort as dates); the values removed, in order. Nothing
    to do when `location` does not exist."""
    path = _hadoop_path(spark, location)
    fs = path.getFileSystem(_hadoop_conf(spark))
    if not fs.exists(path):
        return []
    removed = []
    for status in fs.listStatus(path):
        key, sep, value = str(status.getPath().getName()).partition("=")
        if status.isDirectory() and sep and key == column and value >= from_value:
            fs.delete(status.getPath(), True)
            removed.append(value)
    return sorted(removed)


def _hadoop_path(spark: SparkSession, location: str) -> Any:
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "the Spark session has no JVM"
    return jvm.org.apache.hadoop.fs.Path(location)


def _hadoop_conf(spark: SparkSession) -> Any:
    return spark.sparkContext._jsc.hadoopConfiguration()


def files_by_partition(spark: SparkSession, location: str) -> dict[str, list[list[Any]]]:
    """The data files of each partition directory `column=value` directly under `location`, as
    sorted `[name, length]` pairs (checksum files, whose names start with a dot, left out); {} when
    `location` does not exist. One recursive listing: a few requests on an object store too."""
    path = _hadoop_path(spark, location)
    fs = path.getFileSystem(_hadoop_conf(spark))
    if not fs.exists(path):
        return {}
    found: dict[str, list[list[Any]]] = {}
    listing = fs.listFiles(path, True)
    while listing.hasNext():
        status = listing.next()
        name, partition = str(status.getPath().getName()), str(status.getPath().getParent().getName())
        if not name.startswith(".") and "=" in partition:
            found.setdefault(partition, []).append([name, int(status.getLen())])
    return {partition: sorted(files) for partition, files in found.items()}


def write_text(spark: SparkSession, location: str, text: str) -> None:
    """Write `text` (UTF-8) as the file at `location`, replacing it."""
    path = _hadoop_path(spark, location)
    stream = path.getFileSystem(_hadoop_conf(spark)).create(path, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def read_text(spark: SparkSession, location: str) -> str:
    """The UTF-8 text of the file at `location`."""
    path = _hadoop_path(spark, location)
    stream = path.getFileSystem(_hadoop_conf(spark)).open(path)
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "the Spark session has no JVM"
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()
