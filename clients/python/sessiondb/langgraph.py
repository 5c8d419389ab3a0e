"""LangGraph's checkpointer on sessiondb: ``graph.compile(checkpointer=SessiondbSaver(client))``.

How a thread is stored. Each (``thread_id``, ``checkpoint_ns``) pair is two sessiondb sessions,
both recorded for the user ``prefix + thread_id`` (so ``delete_thread`` finds them in one
listing):

- the checkpoint session, whose message tree is the checkpoint tree: each checkpoint is a
  message with the checkpoint's id, appended under its parent checkpoint (a new root when it
  has none), so a replay from an older checkpoint is a branch, and the newest checkpoint is the
  session's active leaf. The message holds the checkpoint without its channel values, its
  metadata (both serialised by the saver's serde), the parent's id, the values of the channels
  this checkpoint changed (``new_versions``), and for every channel the id of the checkpoint
  that holds its value at this version. A value is stored once, by the checkpoint that changed
  it; a value that did not change is not stored again. A value that extends the channel's
  previous one (a list LangGraph appended to, such as a message history) is stored as what was
  added: the serialised items after the previous value's, and where they go. A chain of such
  extensions ends in a whole value at most ``MAX_EXTENSION_DEPTH`` links below, so a thread's
  growing history takes space in proportion to its length instead of its square, and a cold
  read rebuilds a value from at most that many messages.
- the side session (its id ends in ``/writes``), holding pending writes: messages under a root
  message named after their checkpoint, one per ``put_writes`` call, with an id made of the
  checkpoint, the task and its first write index, so a repeated call stores nothing.

A checkpoint is one append, so it is stored whole or not at all. Checkpoint messages never
change, so the saver keeps recently written and read ones in memory (``cache_bytes``) and
finds the values an older checkpoint holds there, asking the server only for those it lacks;
it also keeps the serialised values it wrote or rebuilt, which a value extending them needs.

``prune`` and ``delete_for_runs`` delete checkpoint messages; a value a remaining checkpoint
still reads from a deleted one (directly or as the base of an extension) moves first, whole, to
a message of the side session (``values:<checkpoint id>``), where readers look when the
checkpoint is gone.

Moving in. ``copy_threads`` copies threads from any other checkpointer (``SqliteSaver``,
``PostgresSaver``, ``InMemorySaver``, ...): every namespace's checkpoints, oldest first, each
with its metadata, its parent and its pending writes, as the graph had put them here. Each
checkpoint is one write after its pending writes, so a copy cut short leaves whole checkpoints
and is finished by running it again (what was copied is stored once); a namespace whose newest
checkpoint the target has is skipped.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from .client import Client, Copied, RememberedIds, SessiondbError, bounded_id, joined_id
from .langgraph_store import SessiondbStore, copy_store

__all__ = ["SessiondbSaver", "SessiondbStore", "acopy_threads", "copy_store", "copy_threads"]

THREAD_KEY = "langgraphThread"
VALUES_PREFIX = "values:"
# Import requests of copy_thread stay well under the server's body limit (64 MiB by default).
IMPORT_REQUEST_BYTES = 8 << 20
# Links of extensions at most between a value and the whole one it is rebuilt from.
MAX_EXTENSION_DEPTH = 16
# Values smaller than this are stored whole: each link costs a cold read one more message.
MIN_EXTENDED_BYTES = 1024
# Checkpoints a cold read takes up a path at most, in one request, for the links of chains.
PREFETCHED_CHECKPOINTS = 4 * MAX_EXTENSION_DEPTH
_END = object()
_MISSING = {"values": {}, "holders": {}}


def _encode(typed: tuple[str, bytes]) -> dict:
    return {"type": typed[0], "data": base64.b64encode(typed[1]).decode()}


def _decode(stored: dict) -> tuple[str, bytes]:
    return stored["type"], base64.b64decode(stored["data"])


def _msgpack_array(data: bytes) -> tuple[int, int] | None:
    """(items, header bytes) when ``data`` is a msgpack array."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if first == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def _extension(old: bytes, new: bytes) -> tuple[bytes, int, bytes] | None:
    """How msgpack array ``new`` extends msgpack array ``old``: its header, where ``old``'s
    items start and the items after them, so that ``new == header + old[start:] + added``; None
    unless ``new`` begins with exactly ``old``'s items (a reducer that added nothing gives an
    equal array, nothing added). A msgpack item's encoding is self-delimiting, so the byte
    comparison is the whole check."""
    was, now = _msgpack_array(old), _msgpack_array(new)
    if was is None or now is None or now[0] < was[0]:
        return None
    items = old[was[1]:]
    if not new.startswith(items, now[1]):
        return None
    return new[:now[1]], was[1], new[now[1] + len(items):]


class _Memory:
    """Entries least recently used dropped first once their sizes pass ``budget`` bytes. What
    the saver keeps here is safe to trust: a checkpoint message never changes, and checkpoint
    ids are never reused."""

    def __init__(self, budget: int):
        self.budget = budget
        self.held = 0
        self.entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self.guard = threading.Lock()

    def get(self, key: tuple) -> Any:
        with self.guard:
            entry = self.entries.get(key)
            if entry is None:
                return None
            self.entries.move_to_end(key)
            return entry[0]

    def put(self, key: tuple, value: Any, size: int) -> None:
        with self.guard:
            replaced = self.entries.pop(key, None)
            if replaced is not None:
                self.held -= replaced[1]
            self.entries[key] = (value, size)
            self.held += size
            while self.held > self.budget and self.entries:
                _, (_, dropped) = self.entries.popitem(last=False)
                self.held -= dropped


class SessiondbSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer keeping threads on the sessiondb server behind ``client``.

    ``prefix`` is put before every session id and owner it writes, to keep its threads apart
    from other sessions of the namespace. The async methods run the blocking calls on a worker
    thread. Each checkpoint and each ``put_writes`` call is a message, so a thread holds at most
    the server's ``--max-messages-per-session`` of them (10,000 by default) per namespace.
    """

    def __init__(self, client: Client, prefix: str = "", *, serde: Any = None,
                 cache_bytes: int = 32 << 20):
        super().__init__(serde=serde)
        self.client = client
        self.prefix = prefix
        # Checkpoint contents by (session, checkpoint id), and serialised values by (session,
        # holder, channel) as (version, type, bytes, links below), half of the budget each.
        self._contents = _Memory(cache_bytes // 2)
        self._values = _Memory(cache_bytes // 2)
        self._created = RememberedIds()

    # -- naming ------------------------------------------------------------------------------

    def _sessions(self, thread_id: str, checkpoint_ns: str) -> tuple[str, str]:
        """The checkpoint session and the side session of a thread's namespace."""
        base = joined_id(thread_id, checkpoint_ns)
        return bounded_id(base, self.prefix), bounded_id(base + "/writes", self.prefix)

    def _owner(self, thread_id: str) -> str:
        return bounded_id(thread_id, self.prefix)

    def _ensure_sessions(self, thread_id: str, checkpoint_ns: str) -> tuple[str, str]:
        """Creates the namespace's sessions with their owner the first time this saver writes
        to them (a ``conflict`` when another process did)."""
        sessions = self._sessions(thread_id, checkpoint_ns)
        for session_id in sessions:
            if session_id in self._created:
                continue
            try:
                self.client.create_session(
                    session_id, userId=self._owner(thread_id),
                    metadata={THREAD_KEY: {"threadId": thread_id, "checkpointNs": checkpoint_ns}})
            except SessiondbError as error:
                if error.code != "conflict":
                    raise
            self._created.add(session_id)
        return sessions

    # -- writing -----------------------------------------------------------------------------

    def get_next_version(self, current: Any, channel: None = None) -> Any:
        """Integers, LangGraph's default; a thread copied from a checkpointer with versions of
        the form ``<32-digit counter>.<random>`` (``SqliteSaver``, ``PostgresSaver``,
        ``InMemorySaver``) goes on in that form, as LangGraph compares a thread's versions
        with each other."""
        if isinstance(current, str):
            return f"{int(current.split('.', 1)[0]) + 1:032}.{random.random():016}"
        return super().get_next_version(current, channel)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        sessions = self._ensure_sessions(thread_id, checkpoint_ns)
        checkpoints = sessions[0]

        checkpoint_id = checkpoint["id"]
        channel_values = checkpoint["channel_values"]
        inherited = self._content(sessions, parent_id).get("holders", {}) if parent_id else {}
        values = {}
        for channel, version in new_versions.items():
            if channel in channel_values:
                values[channel] = self._stored(checkpoints, checkpoint_id, channel, version,
                                               self.serde.dumps_typed(channel_values[channel]),
                                               inherited.get(channel))
            else:
                values[channel] = {"version": version, "type": "empty"}
        holders = {}
        for channel, version in checkpoint["channel_versions"].items():
            if channel in values:
                holders[channel] = [checkpoint_id, version]
            elif channel in inherited:
                holders[channel] = inherited[channel]
        skeleton = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        content = {
            "checkpoint": _encode(self.serde.dumps_typed(skeleton)),
            "metadata": _encode(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
            "parentCheckpointId": parent_id,
            "values": values,
            "holders": holders,
        }
        self.client.append(checkpoints, {"id": checkpoint_id, "role": "checkpoint",
                                         "content": content}, parent=parent_id)
        self._remember(checkpoints, checkpoint_id, content)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                 "checkpoint_id": checkpoint_id}}

    def _stored(self, checkpoints: str, checkpoint_id: str, channel: str, version: Any,
                typed: tuple[str, bytes], previous: list | None) -> dict:
        """A channel's new value as its checkpoint stores it: as an extension of the channel's
        ``previous`` value (its holder and version) when this saver has that value in memory,
        the new one extends it and its chain is short enough; else whole."""
        kind, data = typed
        entry: dict[str, Any] = {"version": version, "type": kind}
        depth, kept = 0, data
        base = self._values.get((checkpoints, previous[0], channel)) if previous else None
        if (base is not None and base[0] == previous[1] and base[1] == kind == "msgpack"
                and len(base[2]) >= MIN_EXTENDED_BYTES and base[3] < MAX_EXTENSION_DEPTH
                and (extension := _extension(base[2], data)) is not None):
            head, start, kept = extension
            depth = base[3] + 1
            entry.update(base=list(previous), head=base64.b64encode(head).decode(),
                         span=[start, len(base[2])], depth=depth)
        entry["data"] = base64.b64encode(kept).decode()
        self._values.put((checkpoints, checkpoint_id, channel), (version, kind, data, depth),
                         len(data))
        return entry

    def _remember(self, checkpoints: str, checkpoint_id: str, content: dict) -> None:
        size = sum(len(v.get("data", "")) for v in content["values"].values()) + 512
        self._contents.put((checkpoints, checkpoint_id), content, size)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        if not writes:
            return
        configurable = config["configurable"]
        checkpoint_id = configurable["checkpoint_id"]
        _, side = self._ensure_sessions(configurable["thread_id"],
                                        configurable.get("checkpoint_ns", ""))
        indexed = [[WRITES_IDX_MAP.get(channel, i), channel,
                    _encode(self.serde.dumps_typed(value))]
                   for i, (channel, value) in enumerate(writes)]
        message = {
            "id": bounded_id(f"{checkpoint_id}:{task_id}:{indexed[0][0]}"),
            "role": "writes",
            "content": {"taskId": task_id, "taskPath": task_path, "writes": indexed},
        }
        if all(channel in WRITES_IDX_MAP for channel in (w[1] for w in indexed)):
            # Special channels (an error, an interrupt) replace what the task wrote before.
            try:
                self.client.replace_message(side, message["id"], message)
                return
            except SessiondbError as error:
                if error.code != "not_found":
                    raise
        anchor = {"id": bounded_id(checkpoint_id), "role": "checkpoint",
                  "content": {"checkpointId": checkpoint_id}}
        self.client.append_batch(side, [anchor, message], parent_id="")

    def delete_thread(self, thread_id: str) -> None:
        # The root namespace's sessions are deleted by name as well: if another process
        # deleted the thread while this saver went on writing, they exist without an owner.
        namespaces = {ns for _, ns in self._namespaces({"thread_id": thread_id})} | {""}
        doomed = {session_id for ns in namespaces for session_id in self._sessions(thread_id, ns)}
        for session_id in doomed:
            self.client.delete_session(session_id, missing_ok=True)
        self._created -= doomed

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every namespace of a thread, checkpoints (the tree, ids, values and metadata
        as they are) and pending writes, into the target thread, beside what it has (ids it
        has already are skipped). Writes are copied before the checkpoints they belong to, in
        imports of at most ``IMPORT_REQUEST_BYTES`` each stored whole, so a copy cut short
        leaves whole checkpoints that have their writes."""
        for _, checkpoint_ns in self._namespaces({"thread_id": source_thread_id}):
            sources = self._sessions(source_thread_id, checkpoint_ns)
            targets = self._ensure_sessions(target_thread_id, checkpoint_ns)
            for source, target in reversed(list(zip(sources, targets))):
                self._import(target, self._export(source))

    def _import(self, session_id: str, lines: Iterator[dict]) -> None:
        batch: list[dict] = []
        size = 0
        for line in lines:
            line_size = len(json.dumps(line))
            if batch and size + line_size > IMPORT_REQUEST_BYTES:
                self.client.import_lines(session_id, batch)
                batch, size = [], 0
            batch.append(line)
            size += line_size
        if batch:
            self.client.import_lines(session_id, batch)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: each namespace of these threads keeps only its newest checkpoint
        (with its pending writes and every value it reads); ``delete``: the threads go."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            for _, checkpoint_ns in self._namespaces({"thread_id": thread_id}):
                contents = self._checkpoint_contents(thread_id, checkpoint_ns)
                if contents:
                    self._delete_checkpoints(thread_id, checkpoint_ns, contents,
                                             set(contents) - {max(contents)})

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Deletes the checkpoints (and their pending writes) whose metadata names one of these
        runs, in every thread of this saver. sessiondb keeps no index of run ids, so this reads
        every checkpoint of the saver's threads once: a clean-up, not something for every run."""
        wanted = set(run_ids)
        if not wanted:
            return
        for thread_id, checkpoint_ns in self._namespaces({}):
            contents = self._checkpoint_contents(thread_id, checkpoint_ns)
            doomed = {checkpoint_id for checkpoint_id, content in contents.items()
                      if self.serde.loads_typed(_decode(content["metadata"])).get("run_id")
                      in wanted}
            if doomed:
                self._delete_checkpoints(thread_id, checkpoint_ns, contents, doomed)

    def _delete_checkpoints(self, thread_id: str, checkpoint_ns: str,
                            contents: dict[str, dict], doomed: set[str]) -> None:
        """Deletes the ``doomed`` checkpoints of a namespace whose checkpoints are ``contents``,
        and their writes. The values the others still read from them move to the side session
        first, so no remaining checkpoint ever lacks one."""
        sessions = self._sessions(thread_id, checkpoint_ns)
        checkpoints, side = sessions

        def content_of(holder: str) -> dict:
            return contents.get(holder) or self._content(sessions, holder)

        moved: dict[str, dict] = {}
        read: set[str] = set()  # the values messages remaining checkpoints may read
        for checkpoint_id, content in contents.items():
            if checkpoint_id in doomed:
                continue
            for channel, (holder, version) in content["holders"].items():
                # Down the chain of extensions to the first link in a doomed checkpoint, which
                # moves whole (so no chain leads into a deleted checkpoint), or to its end.
                while True:
                    read.add(bounded_id(VALUES_PREFIX + holder))
                    held = contents.get(holder)
                    stored = held["values"].get(channel) if held else None
                    if stored is None or stored["version"] != version:
                        break
                    if holder in doomed:
                        if "base" in stored:
                            kind, data = self._value(sessions, content_of, holder, channel,
                                                     version)
                            stored = {"version": version, "type": kind,
                                      "data": base64.b64encode(data).decode()}
                        moved.setdefault(holder, {})[channel] = stored
                        break
                    if "base" not in stored:
                        break
                    holder, version = stored["base"]
        for holder, values in moved.items():
            # A replace, not an append: a run cut short before its deletes may have left a
            # message for this holder with what other checkpoints read then.
            self.client.replace_message(side, bounded_id(VALUES_PREFIX + holder),
                                        {"role": "values", "content": {"values": values}},
                                        upsert=True)
        self.client.delete_messages(checkpoints, doomed)
        # The doomed checkpoints' writes, and moved values no remaining checkpoint reads.
        anchors = {bounded_id(checkpoint_id) for checkpoint_id in doomed}
        unused = [line["message"]["id"] for line in self._export(side) if "message" in line
                  and (line["message"]["id"] in anchors or line.get("parentId") in anchors
                       or (line["message"]["role"] == "values"
                           and line["message"]["id"] not in read))]
        if unused:
            self.client.delete_messages(side, unused)

    # -- reading -----------------------------------------------------------------------------

    def _content(self, sessions: tuple[str, str], checkpoint_id: str, *,
                 remembered: bool = True) -> dict:
        """The content of a checkpoint message (for the values it holds and its holders), from
        memory when this saver has it (and ``remembered``); for a checkpoint pruned away, the
        values that moved to the side session; for one that never was, ``_MISSING``."""
        checkpoints, side = sessions
        content = self._contents.get((checkpoints, checkpoint_id)) if remembered else None
        if content is not None:
            return content
        for session_id, message_id in [(checkpoints, checkpoint_id),
                                       (side, bounded_id(VALUES_PREFIX + checkpoint_id))]:
            try:
                content = self.client.get_message(session_id, message_id)["content"]
            except SessiondbError as error:
                if error.code == "not_found":
                    continue
                raise
            self._remember(checkpoints, checkpoint_id, content)
            return content
        return _MISSING

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        sessions = self._sessions(thread_id, checkpoint_ns)
        checkpoints = sessions[0]
        checkpoint_id = get_checkpoint_id(config)
        # The checkpoint itself always comes from the server, even when remembered: it may
        # have been deleted since (by this process or another).
        if checkpoint_id:
            try:
                message = self.client.get_message(checkpoints, checkpoint_id)
            except SessiondbError as error:
                if error.code == "not_found":
                    return None
                raise
        else:
            newest = self.client.messages(checkpoints, limit=1, order="desc")["items"]
            if not newest:
                return None
            message = newest[0]
        content = message["content"]
        self._remember(checkpoints, message["id"], content)
        self._prefetch_chains(checkpoints, message["id"], content)
        return self._tuple(thread_id, checkpoint_ns, content,
                           lambda holder: self._content(sessions, holder))

    def _prefetch_chains(self, checkpoints: str, checkpoint_id: str, content: dict) -> None:
        """When values of a checkpoint extend values this saver does not have in memory (a
        process that did not write them), reads the checkpoints up its path in one request,
        newest first, until each of those chains reaches a whole value, so rebuilding them asks
        for no link on its own. The links are the checkpoint's ancestors."""
        chains = set()
        for channel, stored in content["values"].items():
            base = stored.get("base")
            known = self._values.get((checkpoints, base[0], channel)) if base else None
            if base and (known is None or known[0] != base[1]):
                chains.add(channel)
        if not chains:
            return
        path = self.client.history(checkpoints, order="newest", leaf=checkpoint_id)
        try:
            for read, message in enumerate(path):
                if read >= PREFETCHED_CHECKPOINTS:
                    break
                if message.get("role") != "checkpoint":
                    continue
                values = message["content"]["values"]
                self._remember(checkpoints, message["id"], message["content"])
                chains -= {c for c in chains if c in values and "base" not in values[c]}
                if not chains:
                    break
        except SessiondbError as error:
            if error.code != "not_found":  # deleted meanwhile: the links are asked for alone
                raise
        finally:
            path.close()

    def _tuple(self, thread_id: str, checkpoint_ns: str, content: dict,
               holder_content: Callable[[str], dict]) -> CheckpointTuple:
        checkpoints, side = self._sessions(thread_id, checkpoint_ns)
        checkpoint = self.serde.loads_typed(_decode(content["checkpoint"]))

        def content_of(holder: str) -> dict:
            return content if holder == checkpoint["id"] else holder_content(holder)

        values = {}
        for channel, (holder, version) in content["holders"].items():
            value = self._value((checkpoints, side), content_of, holder, channel, version)
            if value is not None:
                values[channel] = self.serde.loads_typed(value)
        checkpoint["channel_values"] = values

        pending = []
        for message in self._writes_of(side, checkpoint["id"]):
            task_id = message["content"]["taskId"]
            for idx, channel, value in message["content"]["writes"]:
                pending.append((task_id, idx, channel, self.serde.loads_typed(_decode(value))))
        pending.sort(key=lambda w: (w[0], w[1]))

        def config_of(checkpoint_id: str) -> RunnableConfig:
            return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                     "checkpoint_id": checkpoint_id}}

        parent_id = content.get("parentCheckpointId")
        return CheckpointTuple(
            config=config_of(checkpoint["id"]),
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(_decode(content["metadata"])),
            parent_config=config_of(parent_id) if parent_id else None,
            pending_writes=[(task, channel, value) for task, _, channel, value in pending],
        )

    def _value(self, sessions: tuple[str, str], content_of: Callable[[str], dict], holder: str,
               channel: str, version: Any, *, fresh: bool = False) -> tuple[str, bytes] | None:
        """The serialised value ``channel`` had at ``version``, held by checkpoint ``holder``
        (whose content ``content_of`` gives): stored whole, or rebuilt from the values its
        extensions lead down to. None when the channel was empty then or nothing holds it."""
        key = (sessions[0], holder, channel)
        known = self._values.get(key)
        if known is not None and known[0] == version:
            return known[1], known[2]
        stored = content_of(holder)["values"].get(channel)
        if stored is None or stored["version"] != version or stored["type"] == "empty":
            return None
        data = base64.b64decode(stored["data"])
        if "base" in stored:
            base_holder, base_version = stored["base"]
            below = self._value(sessions, content_of, base_holder, channel, base_version)
            if below is None:
                if fresh:
                    raise LookupError(f"the value of {channel!r} in checkpoint {holder} extends "
                                      f"one of checkpoint {base_holder} that is not stored")
                # This content was read before a prune deleted its base; the prune moved the
                # value itself whole to the side session first.
                return self._value(sessions, lambda h: self._content(sessions, h, remembered=False),
                                   holder, channel, version, fresh=True)
            start, end = stored["span"]
            data = base64.b64decode(stored["head"]) + below[1][start:end] + data
        self._values.put(key, (version, stored["type"], data, stored.get("depth", 0)), len(data))
        return stored["type"], data

    def _writes_of(self, side: str, checkpoint_id: str) -> list[dict]:
        try:
            return self.client.branches(side, bounded_id(checkpoint_id))
        except SessiondbError as error:
            if error.code == "not_found":
                return []
            raise

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of one thread or of every thread (no ``thread_id``, or
        ``config`` ``None``), in one namespace or in every namespace (no ``checkpoint_ns``)."""
        configurable = (config or {}).get("configurable", {})
        before_id = get_checkpoint_id(before) if before else None
        wanted_id = configurable.get("checkpoint_id")
        found = []
        for thread_id, checkpoint_ns in self._namespaces(configurable):
            # The whole namespace is read anyway, so older checkpoints' values come from it.
            contents = self._checkpoint_contents(thread_id, checkpoint_ns)
            for checkpoint_id, content in contents.items():
                if wanted_id and checkpoint_id != wanted_id:
                    continue
                if before_id and checkpoint_id >= before_id:
                    continue
                found.append((checkpoint_id, thread_id, checkpoint_ns, content, contents))
        found.sort(key=lambda f: f[0], reverse=True)
        yielded = 0
        for _, thread_id, checkpoint_ns, content, contents in found:
            if limit is not None and yielded >= limit:
                return
            if filter:
                metadata = self.serde.loads_typed(_decode(content["metadata"]))
                if any(metadata.get(k) != v for k, v in filter.items()):
                    continue
            sessions = self._sessions(thread_id, checkpoint_ns)
            yield self._tuple(thread_id, checkpoint_ns, content,
                              lambda holder: contents.get(holder)
                              or self._content(sessions, holder))
            yielded += 1

    def _checkpoint_contents(self, thread_id: str, checkpoint_ns: str) -> dict[str, dict]:
        """Every checkpoint message's content of a thread's namespace, by checkpoint id."""
        checkpoints, _ = self._sessions(thread_id, checkpoint_ns)
        return {line["message"]["id"]: line["message"]["content"]
                for line in self._export(checkpoints)
                if line.get("message", {}).get("role") == "checkpoint"}

    def _export(self, session_id: str) -> Iterator[dict]:
        try:
            yield from self.client.export(session_id)
        except SessiondbError as error:
            if error.code != "not_found":
                raise

    def _namespaces(self, configurable: dict) -> list[tuple[str, str]]:
        thread_id = configurable.get("thread_id")
        if thread_id is not None and "checkpoint_ns" in configurable:
            return [(thread_id, configurable["checkpoint_ns"])]
        owner = self._owner(thread_id) if thread_id is not None else None
        found = []
        for session in self.client.list_sessions(user_id=owner):
            stored = (session.get("metadata") or {}).get(THREAD_KEY)
            if not isinstance(stored, dict) or session["id"].endswith("/writes"):
                continue
            if thread_id is not None and stored.get("threadId") != thread_id:
                continue
            if "checkpoint_ns" in configurable and stored.get("checkpointNs") != configurable["checkpoint_ns"]:
                continue
            if not session["id"].startswith(self.prefix):
                continue
            found.append((stored["threadId"], stored["checkpointNs"]))
        return found

    # -- async -------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        found = self.list(config, filter=filter, before=before, limit=limit)
        while (item := await asyncio.to_thread(next, found, _END)) is not _END:
            yield item


def copy_threads(source: BaseCheckpointSaver, target: SessiondbSaver,
                 thread_ids: Iterable[str] | None = None) -> Copied:
    """Copies threads (these, or every thread ``source.list(None)`` gives, which reads every
    checkpoint of ``source`` once to find them) from ``source`` into ``target`` (see the
    module's documentation): the thread ids copied, and those skipped as the target had each
    of their namespaces' newest checkpoint. ``acopy_threads`` reads an async checkpointer."""
    if thread_ids is None:
        thread_ids = dict.fromkeys(t.config["configurable"]["thread_id"]
                                   for t in source.list(None))
    copied = Copied([], [])
    for thread_id in thread_ids:
        found = list(source.list({"configurable": {"thread_id": thread_id}}))
        (copied.copied if _copy_thread(target, thread_id, found) else copied.skipped).append(
            thread_id)
    return copied


async def acopy_threads(source: BaseCheckpointSaver, target: SessiondbSaver,
                        thread_ids: Iterable[str] | None = None) -> Copied:
    """``copy_threads`` from a checkpointer read through its async methods (``alist``), such
    as ``AsyncSqliteSaver`` or ``AsyncPostgresSaver``; the writes run on a worker thread."""
    if thread_ids is None:
        thread_ids = dict.fromkeys([t.config["configurable"]["thread_id"]
                                    async for t in source.alist(None)])
    copied = Copied([], [])
    for thread_id in thread_ids:
        found = [t async for t in source.alist({"configurable": {"thread_id": thread_id}})]
        done = await asyncio.to_thread(_copy_thread, target, thread_id, found)
        (copied.copied if done else copied.skipped).append(thread_id)
    return copied


def _copy_thread(target: SessiondbSaver, thread_id: str, found: list[CheckpointTuple]) -> bool:
    """Copies a thread's checkpoints (every namespace's), oldest first, into ``target``, but
    not the namespaces whose newest checkpoint it has: whether anything was written."""
    namespaces: dict[str, list[CheckpointTuple]] = {}
    for checkpoint in found:
        namespaces.setdefault(checkpoint.config["configurable"].get("checkpoint_ns", ""),
                              []).append(checkpoint)
    wrote = False
    for checkpoint_ns, checkpoints in namespaces.items():
        checkpoints.sort(key=lambda t: t.checkpoint["id"])
        try:
            target.client.get_message(target._sessions(thread_id, checkpoint_ns)[0],
                                      checkpoints[-1].checkpoint["id"])
            continue
        except SessiondbError as error:
            if error.code != "not_found":
                raise
        versions = {t.checkpoint["id"]: t.checkpoint["channel_versions"] for t in checkpoints}
        for checkpoint in checkpoints:
            _copy_checkpoint(target, checkpoint, versions)
        wrote = True
    return wrote


def _copy_checkpoint(target: SessiondbSaver, found: CheckpointTuple,
                     versions: dict[str, ChannelVersions]) -> None:
    """Puts one checkpoint of another checkpointer into ``target``, its pending writes first:
    with the channels whose version differs from its parent's (all of them when the parent is
    not among ``versions``, the copied checkpoints' channel versions) as the new ones."""
    configurable = found.config["configurable"]
    thread = {"thread_id": configurable["thread_id"],
              "checkpoint_ns": configurable.get("checkpoint_ns", "")}
    config: RunnableConfig = {"configurable": {**thread, "checkpoint_id": found.checkpoint["id"]}}
    by_task: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in found.pending_writes or []:
        if channel in WRITES_IDX_MAP:
            # Each special write was a call of its own, replacing what the task wrote before.
            target.put_writes(config, [(channel, value)], task_id)
        else:
            by_task.setdefault(task_id, []).append((channel, value))
    for task_id, writes in by_task.items():
        target.put_writes(config, writes, task_id)

    parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    before = versions.get(parent, {}) if parent else {}
    changed = {channel: version for channel, version in found.checkpoint["channel_versions"].items()
               if before.get(channel) != version}
    put_config: RunnableConfig = {"configurable": {**thread, "checkpoint_id": parent}
                                  if parent else dict(thread)}
    target.put(put_config, found.checkpoint, found.metadata, changed)
