"""Strands Agents sessions on a real server, driven by Strands' own Agent, Graph and session
manager with a scripted model, and compared with Strands' FileSessionManager."""

from __future__ import annotations

import json
import logging
import random
import tempfile
import unittest
from typing import Any

from served import ServedTest
from strands import Agent, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.models.model import Model
from strands.multiagent import GraphBuilder
from strands.session import FileSessionManager, RepositorySessionManager
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, SessionType

from sessiondb import CopyConflict
from sessiondb.strands import SessiondbSessionRepository, copy_sessions, text_of

# Strands logs each restored agent, tool call and failed node; the tests read what was stored.
logging.getLogger("strands").setLevel(logging.CRITICAL)


class ScriptedModel(Model):
    """Answers with how many messages it was shown and the text of the last one; asked to
    ``echo`` with a tool at hand, calls it first. A user message holding "secret" is redacted,
    as a guardrail would have it. ``fail_next`` makes the next call fail."""

    def __init__(self, fail_next: bool = False):
        self.config: dict[str, Any] = {}
        self.fail_next = fail_next
        self.calls = 0

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> Any:
        return self.config

    async def structured_output(self, output_model, prompt, system_prompt=None, **kwargs):
        raise NotImplementedError
        yield

    async def stream(self, messages, tool_specs=None, system_prompt=None, **kwargs):
        self.calls += 1
        last = messages[-1]
        yield {"messageStart": {"role": "assistant"}}
        if tool_specs and "echo" in text_of(last):
            use = {"toolUseId": f"use-{len(messages)}", "name": tool_specs[0]["name"]}
            yield {"contentBlockStart": {"start": {"toolUse": use}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": '{"word": "hi"}'}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
            return
        shown = text_of(last) or json.dumps([b for b in last["content"] if "toolResult" in b])
        answer = f"shown {len(messages)}, last {shown}"
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the model is down")
        if "secret" in shown:
            answer = "I cannot repeat that."
            yield {"redactContent": {"redactUserContentMessage": "[redacted]"}}
        yield {"contentBlockStart": {"start": {}}}
        yield {"contentBlockDelta": {"delta": {"text": answer}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "end_turn"}}


@tool
def shout(word: str) -> str:
    """Says a word loudly."""
    return word.upper()


def run(manager, prompt: str, **agent_options: Any) -> tuple[str, Agent]:
    agent = Agent(model=ScriptedModel(), session_manager=manager, callback_handler=None,
                  **agent_options)
    return str(agent(prompt)).strip(), agent


def without_tracking(messages: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "metadata"} for m in messages]


class RepositoryTest(ServedTest):
    def setUp(self):
        self.prefix = self.fresh_prefix()
        self.repository = SessiondbSessionRepository(self.client, prefix=self.prefix)

    def manager(self, session_id: str = "chat", repository=None) -> RepositorySessionManager:
        return RepositorySessionManager(session_id=session_id,
                                        session_repository=repository or self.repository)

    def test_an_agent_keeps_its_conversation_across_managers_and_processes(self):
        first, _ = run(self.manager(), "hello")
        # Another repository (another process, say) loads the conversation and goes on.
        elsewhere = SessiondbSessionRepository(self.client, prefix=self.prefix)
        second, _ = run(self.manager(repository=elsewhere), "again")
        third, agent = run(self.manager(), "and once more")
        self.assertEqual((first, second, third), (
            "shown 1, last hello", "shown 3, last again", "shown 5, last and once more"))
        conversation = self.repository.conversation_of("chat", "default")
        self.assertEqual(conversation, self.prefix + "chat/default")
        stored = self.client.full_history(conversation)
        self.assertEqual([(m["role"], m["content"]) for m in stored], [
            ("user", "hello"), ("assistant", "shown 1, last hello"), ("user", "again"),
            ("assistant", "shown 3, last again"), ("user", "and once more"),
            ("assistant", "shown 5, last and once more")])
        # Plain text is kept once: as the message's content, not again in the metadata.
        self.assertNotIn("content", stored[0]["metadata"]["strandsMessage"]["message"])
        self.assertEqual(len(agent.messages), 6)
        hits = self.client.search(conversation, "shown again")
        self.assertEqual([h["content"] for h in hits], ["shown 3, last again"])
        # The session's and the agent's records sit beside each other in the session's state.
        state = self.client.all_state(self.prefix + "chat")
        self.assertEqual(sorted(state), ["strandsAgent:default", "strandsSession"])
        self.assertEqual(state["strandsSession"]["session_id"], "chat")

    def test_tool_uses_and_results_come_back_as_the_agent_held_them(self):
        _, agent = run(self.manager(), "echo this", tools=[shout])
        kinds = [[next(iter(b)) for b in m["content"]] for m in agent.messages]
        self.assertEqual(kinds, [["text"], ["toolUse"], ["toolResult"], ["text"]])
        _, restored = run(self.manager(repository=SessiondbSessionRepository(
            self.client, prefix=self.prefix)), "plain", tools=[shout])
        self.assertEqual(without_tracking(restored.messages[:4]),
                         without_tracking(agent.messages))
        self.assertEqual([m["tracking_id"] for m in restored.messages[:4]],
                         [m["tracking_id"] for m in agent.messages])
        self.assertIn("HI", restored.messages[3]["content"][0]["text"])

    def test_a_redacted_message_is_stored_and_searched_as_redacted(self):
        run(self.manager(), "my secret is swordfish")
        conversation = self.repository.conversation_of("chat", "default")
        stored = self.client.full_history(conversation)
        self.assertEqual(stored[0]["content"], "[redacted]")
        self.assertEqual(self.client.search(conversation, "swordfish"), [])
        again = self.repository.read_message("chat", "default", 0)
        self.assertEqual(text_of(again.to_message()), "[redacted]")
        # Strands redacts the message in place: no record keeps the words redacted.
        self.assertEqual(text_of(again.message), "[redacted]")
        self.assertNotIn("swordfish", json.dumps(stored))
        _, agent = run(self.manager(repository=SessiondbSessionRepository(
            self.client, prefix=self.prefix)), "next")
        self.assertEqual(text_of(agent.messages[0]), "[redacted]")

    def test_agent_state_and_the_conversation_window_are_restored_as_from_the_file_store(self):
        def windowed_turns(manager_of) -> tuple[list[str], Any, int]:
            def windowed():
                return SlidingWindowConversationManager(window_size=4)

            for turn in range(5):
                manager = manager_of()
                _, agent = run(manager, f"turn {turn}", conversation_manager=windowed())
                agent.state.set("turns", turn + 1)
                manager.sync_agent(agent)
            agent = Agent(model=ScriptedModel(), session_manager=manager_of(),
                          conversation_manager=windowed(), callback_handler=None)
            return [text_of(m) for m in agent.messages], agent.state.get("turns"), len(
                manager_of().session_repository.list_messages("chat", "default"))

        with tempfile.TemporaryDirectory() as directory:
            files = windowed_turns(lambda: FileSessionManager("chat", storage_dir=directory))
        # A fresh repository each time: every agent starts from what the server holds.
        ours = windowed_turns(lambda: self.manager(repository=SessiondbSessionRepository(
            self.client, prefix=self.prefix)))
        self.assertEqual(ours, files)
        # The window dropped the first messages; all ten stay stored.
        self.assertEqual((len(ours[0]), ours[1], ours[2]), (4, 5, 10))

    def test_two_agents_restored_from_one_session_both_keep_their_turns(self):
        run(self.manager(), "hello")
        # Two requests at once (two processes, say), each restored before the other wrote.
        elsewhere = SessiondbSessionRepository(self.client, prefix=self.prefix)
        first = Agent(model=ScriptedModel(), session_manager=self.manager(),
                      callback_handler=None)
        second = Agent(model=ScriptedModel(), session_manager=self.manager(
            repository=elsewhere), callback_handler=None)
        first("from the first")
        second("from the second")
        listed = self.repository.list_messages("chat", "default")
        # Strands' file store would have written both turns to the same two files, the second
        # over the first; here both stay, in the order they were written.
        self.assertEqual([text_of(m.message) for m in listed], [
            "hello", "shown 1, last hello", "from the first", "shown 3, last from the first",
            "from the second", "shown 3, last from the second"])
        self.assertEqual([m.message_id for m in listed], [0, 1, 2, 3, 2, 3])
        # The next agent goes on from all of them, its messages after the last index.
        _, agent = run(self.manager(), "and then")
        self.assertEqual(len(agent.messages), 8)
        self.assertEqual(self.repository.read_message("chat", "default", 4).message["content"],
                         [{"text": "and then"}])

    def test_messages_another_client_wrote_read_at_their_positions(self):
        run(self.manager(), "hello")
        conversation = self.repository.conversation_of("chat", "default")
        self.client.append(conversation, {"role": "system", "content": "a note"})
        self.client.append(conversation, {"role": "assistant", "parts": [
            {"type": "text", "text": "from"}, {"type": "text", "text": "elsewhere"}]})
        listed = self.repository.list_messages("chat", "default")
        self.assertEqual([(m.message_id, m.message["role"], text_of(m.message)) for m in listed], [
            (0, "user", "hello"), (1, "assistant", "shown 1, last hello"),
            (2, "user", "a note"), (3, "assistant", "from\nelsewhere")])
        _, agent = run(self.manager(), "go on")
        self.assertEqual(text_of(agent.messages[-1]), "shown 5, last go on")
        self.assertEqual(self.repository.read_message("chat", "default", 4).message["content"],
                         [{"text": "go on"}])
        self.assertEqual(text_of(self.repository.read_message("chat", "default", 3).message),
                         "from\nelsewhere")
        self.assertIsNone(self.repository.read_message("chat", "default", 7))

    def test_a_graph_resumes_from_its_state_in_the_session_as_from_the_file_store(self):
        def failed_then_resumed(manager_of) -> tuple:
            def graph(review_fails: bool):
                models = ScriptedModel(), ScriptedModel(fail_next=review_fails)
                builder = GraphBuilder()
                builder.add_node(Agent(model=models[0], callback_handler=None), "draft")
                builder.add_node(Agent(model=models[1], callback_handler=None), "review")
                builder.add_edge("draft", "review")
                builder.set_graph_id("pipeline")
                builder.set_max_node_executions(4)
                builder.set_session_manager(manager_of())
                return builder.build(), models

            failing, _ = graph(review_fails=True)
            with self.assertRaises(RuntimeError):
                failing("write")
            stored = manager_of().session_repository.read_multi_agent("work", "pipeline")
            # A graph of the same session, elsewhere, goes on with the node that failed.
            resumed, models = graph(review_fails=False)
            result = resumed("write")
            return ((stored["completed_nodes"], stored["next_nodes_to_execute"]),
                    [m.calls for m in models], [n.node_id for n in result.execution_order],
                    sorted(manager_of().session_repository.read_multi_agent(
                        "work", "pipeline")["completed_nodes"]))

        with tempfile.TemporaryDirectory() as directory:
            files = failed_then_resumed(lambda: FileSessionManager("work", storage_dir=directory))
        ours = failed_then_resumed(lambda: self.manager("work", SessiondbSessionRepository(
            self.client, prefix=self.prefix)))
        self.assertEqual(ours, files)
        self.assertEqual(ours[:2], ((["draft"], ["review"]), [0, 1]))
        self.assertEqual(sorted(self.client.all_state(self.prefix + "work")),
                         ["strandsMultiAgent:pipeline", "strandsSession"])

    def test_deleting_a_session_deletes_its_agents_conversations(self):
        run(self.manager(), "hello")
        agent = Agent(model=ScriptedModel(), agent_id="helper", callback_handler=None,
                      session_manager=self.manager())
        agent("hi")
        helper = self.repository.conversation_of("chat", "helper")
        self.assertEqual(len(self.client.full_history(helper)), 2)
        self.repository.delete_session("chat")
        self.assertIsNone(self.repository.read_session("chat"))
        for session in (self.prefix + "chat", helper,
                        self.repository.conversation_of("chat", "default")):
            with self.assertRaises(Exception) as raised:
                self.client.get_session(session)
            self.assertEqual(getattr(raised.exception, "code", None), "not_found")
        with self.assertRaises(SessionException):
            self.repository.delete_session("chat")

    def test_ids_of_any_characters_and_length_name_distinct_sessions(self):
        long = "x" * 300
        for session_id, agent_id in (("a%2Fb", "c"), ("a", "b%2Fc"), (long, "default"),
                                     (long + "y", "default")):
            run(self.manager(session_id), f"in {session_id[:5]} {agent_id}",
                agent_id=agent_id)
        for session_id, agent_id in (("a%2Fb", "c"), ("a", "b%2Fc")):
            messages = self.repository.list_messages(session_id, agent_id)
            self.assertEqual(text_of(messages[0].message), f"in {session_id[:5]} {agent_id}")
        self.assertNotEqual(self.repository.conversation_of(long, "default"),
                            self.repository.conversation_of(long + "y", "default"))
        self.assertEqual(len(self.repository.list_messages(long, "default")), 2)


class SameAsFileSessionManagerTest(ServedTest):
    """The repository calls Strands makes, on Strands' file store and on sessiondb, answer
    alike: random sequences of them, compared call by call."""

    def test_random_calls_answer_as_the_file_store_does(self):
        rng = random.Random(11)
        for case in range(25):
            with tempfile.TemporaryDirectory() as directory:
                files = FileSessionManager("case", storage_dir=directory)
                ours = SessiondbSessionRepository(self.client, prefix=f"compare-{case}:")
                ours.create_session(Session("case", SessionType.AGENT))
                self.compare(rng, files, ours)

    def compare(self, rng: random.Random, files, ours) -> None:
        agents = ["default", "helper"]
        created: dict[str, int] = {}
        for _ in range(30):
            agent_id = rng.choice(agents)
            count = created.get(agent_id)
            action = rng.choice(["create_agent", "append", "append", "append", "read",
                                 "list", "update", "update_agent"])
            if count is None or action == "create_agent":
                if count is None:
                    record = SessionAgent(agent_id, {"n": 0}, {})
                    for store in (files, ours):
                        store.create_agent("case", SessionAgent.from_dict(record.to_dict()))
                    created[agent_id] = 0
                continue
            if action == "append":
                blocks = rng.choice([[{"text": f"m{count}"}],
                                     [{"text": "a"}, {"text": "b"}],
                                     [{"toolUse": {"toolUseId": f"t{count}", "name": "f",
                                                   "input": {"x": count}}}],
                                     [{"image": {"format": "png",
                                                 "source": {"bytes": bytes([count % 256, 1])}}}]])
                record = SessionMessage({"role": rng.choice(["user", "assistant"]),
                                         "content": blocks}, count)
                for store in (files, ours):
                    store.create_message("case", agent_id, SessionMessage.from_dict(
                        record.to_dict()))
                created[agent_id] = count + 1
            elif action == "update" and count:
                index = rng.randrange(count + 1)
                record = SessionMessage({"role": "user", "content": [{"text": "x"}]}, index,
                                        redact_message={"role": "user",
                                                        "content": [{"text": "[gone]"}]})
                answers = [self.outcome(lambda s=store: s.update_message(
                    "case", agent_id, SessionMessage.from_dict(record.to_dict())))
                    for store in (files, ours)]
                self.assertEqual(answers[0], answers[1])
            elif action == "update_agent":
                record = SessionAgent(agent_id, {"n": rng.randrange(9)}, {"removed": count})
                for store in (files, ours):
                    store.update_agent("case", SessionAgent.from_dict(record.to_dict()))
            elif action == "read":
                index = rng.randrange(count + 2)
                self.assertEqual(*[self.shown(store.read_message("case", agent_id, index))
                                   for store in (files, ours)])
            else:
                offset, limit = rng.randrange(count + 1), rng.choice([None, 1, 3])
                self.assertEqual(*[[self.shown(m) for m in store.list_messages(
                    "case", agent_id, limit=limit, offset=offset)] for store in (files, ours)])
            self.assertEqual(*[self.shown_agent(store.read_agent("case", agent_id))
                               for store in (files, ours)])

    @staticmethod
    def outcome(call) -> str:
        try:
            call()
            return "done"
        except SessionException:
            return "refused"

    @staticmethod
    def shown(message: SessionMessage | None):
        if message is None:
            return None
        return (message.message, message.redact_message, message.message_id, message.created_at)

    @staticmethod
    def shown_agent(agent: SessionAgent | None):
        return None if agent is None else (agent.state, agent.conversation_manager_state,
                                           agent.created_at)

    def test_a_session_created_twice_is_refused_as_by_the_file_store(self):
        repository = SessiondbSessionRepository(self.client, prefix=self.fresh_prefix())
        repository.create_session(Session("once", SessionType.AGENT))
        with self.assertRaises(SessionException):
            repository.create_session(Session("once", SessionType.AGENT))
        with self.assertRaises(SessionException):
            repository.update_agent("once", SessionAgent("nobody", {}, {}))
        with self.assertRaises(SessionException):
            repository.update_message("once", "nobody", SessionMessage(
                {"role": "user", "content": [{"text": "x"}]}, 0))


class CopyTest(ServedTest):
    def setUp(self):
        self.prefix = self.fresh_prefix()
        self.target = SessiondbSessionRepository(self.client, prefix=self.prefix)
        self.directory = tempfile.TemporaryDirectory()
        self.addCleanup(self.directory.cleanup)

    def files(self, session_id: str) -> FileSessionManager:
        return FileSessionManager(session_id, storage_dir=self.directory.name)

    def test_sessions_move_in_from_the_file_store_and_go_on(self):
        _, before = run(self.files("one"), "echo first", tools=[shout])
        _, second = run(self.files("one"), "second", tools=[shout])
        second.state.set("mood", "calm")
        second._session_manager.sync_agent(second)
        helper = Agent(model=ScriptedModel(), agent_id="helper", callback_handler=None,
                       session_manager=self.files("one"))
        helper("help")
        run(self.files("two"), "other")
        copied = copy_sessions(self.files("one"), self.target, ["one", "two", "absent"],
                               agent_ids=["default", "helper", "nobody"])
        # From the file store the agents are found; named, they are those.
        self.assertEqual(copied.copied, [("one", "default"), ("one", "helper"),
                                         ("two", "default")])
        self.assertEqual(copied.skipped, [("one", "nobody"), ("two", "helper"),
                                          ("two", "nobody"), ("absent", "default"),
                                          ("absent", "helper"), ("absent", "nobody")])
        source = self.files("one")
        for agent_id in ("default", "helper"):
            self.assertEqual(
                [m.to_dict() for m in self.target.list_messages("one", agent_id)],
                [m.to_dict() for m in source.list_messages("one", agent_id)])
        self.assertEqual(self.target.read_agent("one", "default").to_dict(),
                         source.read_agent("one", "default").to_dict())
        # Dated as the file store dated them.
        first = self.client.full_history(self.target.conversation_of("one", "default"))[0]
        written = source.read_message("one", "default", 0).created_at
        self.assertEqual(first["createdAt"], int(
            __import__("datetime").datetime.fromisoformat(written).timestamp() * 1000))
        # Copied again: nothing to do. After the file store went on: the rest.
        again = copy_sessions(self.files("one"), self.target, ["one"])
        self.assertEqual((again.copied, again.skipped), ([], [("one", "default"),
                                                              ("one", "helper")]))
        run(self.files("one"), "third")
        later = copy_sessions(self.files("one"), self.target, ["one"])
        self.assertEqual(later.copied, [("one", "default")])
        self.assertEqual(len(self.target.list_messages("one", "default")), 8)
        # The agent goes on in sessiondb, from the messages it had.
        manager = RepositorySessionManager(session_id="one", session_repository=self.target)
        text, agent = run(manager, "now here", tools=[shout])
        self.assertEqual(text, "shown 9, last now here")
        self.assertEqual(without_tracking(agent.messages[:4]), without_tracking(before.messages))
        self.assertEqual(agent.state.get("mood"), "calm")

    def test_the_file_stores_agents_and_graphs_are_found(self):
        run(self.files("one"), "hello")
        helper = Agent(model=ScriptedModel(), agent_id="helper", callback_handler=None,
                       session_manager=self.files("one"))
        helper("help")
        builder = GraphBuilder()
        builder.add_node(Agent(model=ScriptedModel(), callback_handler=None), "only")
        builder.set_graph_id("pipeline")
        builder.set_max_node_executions(2)
        builder.set_session_manager(self.files("graph"))
        builder.build()("work")
        copied = copy_sessions(self.files("one"), self.target, ["one", "graph"])
        self.assertEqual(copied, ([("one", "default"), ("one", "helper")], []))
        self.assertEqual(len(self.target.list_messages("one", "helper")), 2)
        # A session of a graph alone: its record and the graph's state.
        source = self.files("graph")
        self.assertEqual(self.target.read_multi_agent("graph", "pipeline"),
                         source.read_multi_agent("graph", "pipeline"))
        self.assertEqual(self.target.read_session("graph").to_dict(),
                         source.read_session("graph").to_dict())
        # Copied again, nothing is written over what went on in sessiondb.
        self.client.put_state(self.prefix + "graph", "strandsMultiAgent:pipeline", {"on": 1})
        copy_sessions(self.files("graph"), self.target, ["graph"])
        self.assertEqual(self.target.read_multi_agent("graph", "pipeline"), {"on": 1})

    def test_a_conversation_holding_other_messages_is_not_copied_over(self):
        run(self.files("one"), "from the files")
        run(RepositorySessionManager(session_id="one", session_repository=self.target),
            "already here")
        with self.assertRaises(CopyConflict) as raised:
            copy_sessions(self.files("one"), self.target, ["one"])
        self.assertFalse(raised.exception.wrote_before)
        self.assertEqual([text_of(m.message) for m in self.target.list_messages("one", "default")],
                         ["already here", "shown 1, last already here"])


if __name__ == "__main__":
    unittest.main()
