"""What the load's clients did that a well-behaved test client does not, counted for the summary:
racing membership pairs and their outcomes, readers moving between sync workers, laggards and
their limited timelines, sends that reached a persister other than their room's. Counts only:
the checks are `workers.harness.membership_races` and `workers.harness.history`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.harness.history import SyncRecord
from workers.harness.laggard import LaggardReader
from workers.harness.membership_races import RaceTally
from workers.harness.sync_reader import SyncReader


@dataclass
class LoadMix:
    races: RaceTally = field(default_factory=RaceTally)
    #: Syncs whose worker differs from the same reader's previous sync.
    worker_switches: int = 0
    laggard_syncs: int = 0
    #: Syncs (of any reader) with at least one timeline that said `limited: true`.
    limited_answers: int = 0
    gaps_filled: int = 0
    gap_events: int = 0
    #: Laggard answers with a room timeline at the filter's limit and not limited (a paged window).
    laggard_full_pages: int = 0
    #: Messages sent through a persister, and those of them whose room another persister wrote.
    sent_via_persister: int = 0
    sent_via_wrong_persister: int = 0
    #: Messages sent through a worker that writes no events (forwarded to the room's persister).
    sent_via_other: int = 0

    def count_readers(self, readers: Iterable[SyncReader], races: RaceTally) -> list[str]:
        """Count the readers' answers and the races; the gaps readers could not fill, as problems
        (the history check also reports each such timeline)."""
        self.races = races
        problems: list[str] = []
        for reader in readers:
            self.count_records(reader.records)
            user = str(reader.client.user_id)
            problems += [f"{user}: gap not filled: {why}" for why in reader.gap_failures]
            if isinstance(reader, LaggardReader):
                self.laggard_syncs += reader.lags
                self.laggard_full_pages += reader.full_pages
        return problems

    def count_records(self, records: Sequence[SyncRecord]) -> None:
        self.worker_switches += sum(1 for a, b in itertools.pairwise(records) if a.worker != b.worker)
        self.limited_answers += sum(1 for r in records if r.limited)
        self.gaps_filled += sum(len(r.filled) for r in records)
        self.gap_events += sum(len(ids) for r in records for _, ids in r.filled)

    def count_routes(
        self, sends: Iterable[tuple[str, str]], writer_of: Mapping[str, str], event_writers: Sequence[str]
    ) -> None:
        """`sends`: (event id, the worker it was sent through); `writer_of`: event id -> the
        persister that stored it."""
        for event_id, via in sends:
            if via not in event_writers:
                self.sent_via_other += 1
                continue
            self.sent_via_persister += 1
            self.sent_via_wrong_persister += writer_of.get(event_id, via) != via

    def summary(self) -> dict[str, Any]:
        return {
            "racing_pairs_sent": self.races.sent,
            "racing_pairs_both_accepted": self.races.both_accepted,
            "racing_pairs_one_refused": self.races.one_refused,
            "racing_pairs_both_refused": self.races.both_refused,
            "racing_pairs_unknown": self.races.unknown,
            "worker_switches": self.worker_switches,
            "laggard_syncs": self.laggard_syncs,
            "laggard_full_pages": self.laggard_full_pages,
            "limited_answers": self.limited_answers,
            "gaps_filled": self.gaps_filled,
            "gap_events_fetched": self.gap_events,
            "sent_via_persister": self.sent_via_persister,
            "sent_via_wrong_persister": self.sent_via_wrong_persister,
            "sent_via_other_workers": self.sent_via_other,
        }
