"""Reads: /sync (incremental, long-polled, from vector-clock tokens) and /messages.

* `handler.py`: `SyncHandler`: the events of a user's rooms between two tokens, paged, long-polled
* `window.py`: a sync's window of visible events (paged by the limits), an initial sync's timelines
* `room_sections.py`: a window's events sorted into the rooms of a Matrix /sync answer
* `stored_sections.py`: the stored streams' sections (account data, to-device, device lists,
  receipts, key counts)
* `filter.py`: a Matrix sync filter: which rooms, which events, lazy-loaded members
* `recent_events.py`: the live events applied lately, so a woken /sync reads no window from the
  database
* `catch_up.py`: a `since` ahead of this worker (from another one): waited for, clamped when no
  sequence reaches it
* `shared_answers.py`: one built and encoded answer for the readers a wake answers alike
* `token_texts.py`: a sync token's text and back, remembered
* `messages.py`: `GET /rooms/{roomId}/messages`: a room's events page by page

The top of the handler families: it may import all of them; none imports it. Never `workers.http`
nor `workers.harness`.
"""
