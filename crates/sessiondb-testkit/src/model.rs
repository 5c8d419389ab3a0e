//! Model-based property test: random sequences of append, branch append, update, delete, clear,
//! import and compaction run against a store and against a plain in-memory tree; after every
//! operation each read path of the store, and its search, must agree with the model.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sessiondb::{
    AppendOptions, Db, HeuristicCounter, HistoryOptions, ImportLine, ImportOptions, ImportPart,
    Message, Parent, Source, Store, StoredMessage, WriteCondition,
};

use crate::{block_on, ids};

/// Ids come from a small pool so that operations collide (re-appends, updates, deletes of
/// existing rows, parents that exist).
const ID_POOL: u8 = 10;

#[derive(Debug, Clone)]
pub enum Op {
    Append {
        id: u8,
        text: String,
        parent: ParentChoice,
    },
    Update {
        id: u8,
        text: String,
    },
    Delete {
        ids: Vec<u8>,
    },
    Clear,
    Import {
        id: u8,
        text: String,
        parent: Option<u8>,
    },
    /// A compaction overlay from one pool id to another (either may be missing or off the path).
    Compact {
        from: u8,
        to: u8,
    },
    /// An append under the active leaf, conditioned on the leaf ([`WriteCondition::Leaf`]).
    AppendIfLeaf {
        id: u8,
        text: String,
        expected: ExpectedLeaf,
    },
    /// Imports lines in parts of the session written together ([`Db::import_together`]), the
    /// first part conditioned on the leaf when `expected` is set: every import lands, or none.
    ImportTogether {
        parts: Vec<Vec<ModelLine>>,
        expected: Option<ExpectedLeaf>,
    },
}

/// An import line of [`Op::ImportTogether`]: (id, text, parent, replace), where `replace`
/// updates a message that exists.
pub type ModelLine = (u8, String, Option<u8>, bool);

#[derive(Debug, Clone)]
pub enum ExpectedLeaf {
    /// The leaf the session has when the op runs (the condition holds).
    Current,
    /// No message.
    Empty,
    Id(u8),
}

#[derive(Debug, Clone)]
pub enum ParentChoice {
    Leaf,
    Root,
    Id(u8),
}

fn id(n: u8) -> String {
    format!("m{n}")
}

fn message(n: u8, text: &str) -> Message {
    let role = if n.is_multiple_of(2) {
        "user"
    } else {
        "assistant"
    };
    Message::text(role, text).with_id(id(n))
}

fn body_bytes(n: u8, text: &str) -> u64 {
    message(n, text).prepare(&HeuristicCounter).bytes()
}

/// Words of the texts: each one its own stem under both backends' stemmers, and none a stem of
/// another, so a search for one finds exactly the messages whose text holds it.
const WORDS: [&str; 8] = [
    "alpha", "bravo", "delta", "kilo", "lima", "oscar", "tango", "zulu",
];

fn op_strategy() -> impl Strategy<Value = Op> {
    // Now and then a text of a few KB, so updates move rows between the layouts a backend may
    // keep short and long texts in (SQLite keeps a text too long for its row's page off it).
    let text = (
        proptest::collection::vec(proptest::sample::select(&WORDS[..]), 0..4),
        prop_oneof![6 => Just(1usize), 1 => Just(200), 1 => Just(1_000)],
    )
        .prop_map(|(words, times)| vec![words.join(" "); times].join(" "))
        .boxed();
    let parent = prop_oneof![
        3 => Just(ParentChoice::Leaf),
        1 => Just(ParentChoice::Root),
        2 => (0..ID_POOL + 2).prop_map(ParentChoice::Id),
    ];
    let expected = prop_oneof![
        2 => Just(ExpectedLeaf::Current),
        1 => Just(ExpectedLeaf::Empty),
        2 => (0..ID_POOL).prop_map(ExpectedLeaf::Id),
    ];
    prop_oneof![
        6 => (0..ID_POOL, text.clone(), parent).prop_map(|(id, text, parent)| Op::Append { id, text, parent }),
        2 => (0..ID_POOL, text.clone()).prop_map(|(id, text)| Op::Update { id, text }),
        2 => proptest::collection::vec(0..ID_POOL, 0..4).prop_map(|ids| Op::Delete { ids }),
        1 => Just(Op::Clear),
        2 => (0..ID_POOL, text.clone(), proptest::option::of(0..ID_POOL + 2))
            .prop_map(|(id, text, parent)| Op::Import { id, text, parent }),
        // Starts from half the pool, so overlays often share a start or nest.
        2 => (0..ID_POOL / 2, 0..ID_POOL).prop_map(|(from, to)| Op::Compact { from, to }),
        2 => (0..ID_POOL, text.clone(), expected.clone())
            .prop_map(|(id, text, expected)| Op::AppendIfLeaf { id, text, expected }),
        2 => (
            proptest::collection::vec(
                proptest::collection::vec((0..ID_POOL, text, proptest::option::of(0..ID_POOL + 2), any::<bool>()), 1..3),
                1..3,
            ),
            proptest::option::of(expected),
        )
            .prop_map(|(parts, expected)| Op::ImportTogether { parts, expected }),
    ]
}

#[derive(Debug, Clone)]
struct Node {
    parent: Option<String>,
    seq: u64,
    n: u8,
    text: String,
}

/// The reference tree: a map of nodes, the active leaf, the next seq and the compactions
/// (`(from, to)` ids in creation order; a clear keeps them).
#[derive(Debug, Clone, Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    leaf: Option<String>,
    next_seq: u64,
    compactions: Vec<(String, String)>,
}

/// One element of a path as reads show it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shown {
    Row(String),
    /// The summary of the compaction with this index.
    Summary(usize),
}

impl Model {
    fn insert(&mut self, n: u8, text: &str, parent: Option<String>) {
        self.next_seq += 1;
        let node = Node {
            parent,
            seq: self.next_seq,
            n,
            text: text.to_owned(),
        };
        self.nodes.insert(id(n), node);
        self.leaf = Some(id(n));
    }

    fn expected_leaf(&self, expected: &ExpectedLeaf) -> Option<String> {
        match expected {
            ExpectedLeaf::Current => self.leaf.clone(),
            ExpectedLeaf::Empty => None,
            ExpectedLeaf::Id(p) => Some(id(*p)),
        }
    }

    /// Applies an op; returns false when the store must refuse it (an import cycle).
    fn apply(&mut self, op: &Op) -> bool {
        match op {
            Op::Append {
                id: n,
                text,
                parent,
            } => {
                if self.nodes.contains_key(&id(*n)) {
                    return true;
                }
                let parent = match parent {
                    ParentChoice::Leaf => self.leaf.clone(),
                    ParentChoice::Root => None,
                    ParentChoice::Id(p) => self.nodes.contains_key(&id(*p)).then(|| id(*p)),
                };
                let parent = parent.filter(|p| !self.reaches(p, &id(*n)));
                self.insert(*n, text, parent);
            }
            Op::AppendIfLeaf {
                id: n,
                text,
                expected,
            } => {
                if self.expected_leaf(expected) != self.leaf {
                    return false;
                }
                if !self.nodes.contains_key(&id(*n)) {
                    // As for any append: never under a row whose ancestry holds this id.
                    let parent = self.leaf.clone().filter(|p| !self.reaches(p, &id(*n)));
                    self.insert(*n, text, parent);
                }
            }
            Op::ImportTogether { parts, expected } => {
                if expected
                    .as_ref()
                    .is_some_and(|e| self.expected_leaf(e) != self.leaf)
                {
                    return false;
                }
                let mut after = self.clone();
                for (n, text, parent, replace) in parts.iter().flatten() {
                    let (id, text, parent) = (*n, text.clone(), *parent);
                    let op = match *replace && after.nodes.contains_key(&self::id(id)) {
                        true => Op::Update { id, text },
                        false => Op::Import { id, text, parent },
                    };
                    if !after.apply(&op) {
                        return false;
                    }
                }
                *self = after;
            }
            Op::Update { id: n, text } => {
                if let Some(node) = self.nodes.get_mut(&id(*n)) {
                    node.text.clone_from(text);
                }
            }
            Op::Import {
                id: n,
                text,
                parent,
            } => {
                if self.nodes.contains_key(&id(*n)) {
                    return true;
                }
                let parent = parent.map(id);
                if parent.as_ref().is_some_and(|p| self.reaches(p, &id(*n))) {
                    return false;
                }
                self.insert(*n, text, parent);
            }
            Op::Delete { ids: victims } => {
                let victims: Vec<String> = victims
                    .iter()
                    .map(|n| id(*n))
                    .filter(|i| self.nodes.contains_key(i))
                    .collect();
                let survivor_of = |model: &Model, mut p: Option<String>| {
                    while let Some(id) = p.clone() {
                        if !victims.contains(&id) {
                            break;
                        }
                        p = model.nodes.get(&id).and_then(|n| n.parent.clone());
                    }
                    p
                };
                let rewires: Vec<(String, Option<String>)> = self
                    .nodes
                    .iter()
                    .filter(|(child, node)| {
                        !victims.contains(child)
                            && node.parent.as_ref().is_some_and(|p| victims.contains(p))
                    })
                    .map(|(child, node)| (child.clone(), survivor_of(self, node.parent.clone())))
                    .collect();
                for (child, parent) in rewires {
                    self.nodes.get_mut(&child).unwrap().parent = parent;
                }
                for v in &victims {
                    self.nodes.remove(v);
                }
                if self.leaf.as_ref().is_some_and(|l| victims.contains(l)) {
                    self.leaf = self
                        .nodes
                        .iter()
                        .max_by_key(|(_, n)| n.seq)
                        .map(|(i, _)| i.clone());
                }
            }
            Op::Clear => {
                self.nodes.clear();
                self.leaf = None;
            }
            Op::Compact { from, to } => self.compactions.push((id(*from), id(*to))),
        }
        true
    }

    /// `path` with the overlays applied, walking from the root: at each row, the newest
    /// compaction starting there whose end lies further down the path stands for the rows up to
    /// that end.
    fn overlaid(&self, path: &[String]) -> Vec<Shown> {
        let mut shown = Vec::new();
        let mut i = 0;
        while i < path.len() {
            let chosen = self
                .compactions
                .iter()
                .enumerate()
                .rev()
                .find_map(|(c, (from, to))| {
                    let end = path.iter().position(|p| p == to)?;
                    (*from == path[i] && end >= i).then_some((c, end))
                });
            match chosen {
                Some((c, end)) => {
                    shown.push(Shown::Summary(c));
                    i = end + 1;
                }
                None => {
                    shown.push(Shown::Row(path[i].clone()));
                    i += 1;
                }
            }
        }
        shown
    }

    /// Whether walking parent links from `from` meets `target` (ids may dangle).
    fn reaches(&self, from: &str, target: &str) -> bool {
        let mut cursor = Some(from.to_owned());
        while let Some(p) = cursor {
            if p == target {
                return true;
            }
            cursor = self.nodes.get(&p).and_then(|node| node.parent.clone());
        }
        false
    }

    fn path(&self, leaf: Option<&str>) -> Vec<String> {
        let mut path = Vec::new();
        let mut cursor = leaf.map(str::to_owned);
        while let Some(id) = cursor {
            let Some(node) = self.nodes.get(&id) else {
                break;
            };
            path.push(id);
            cursor = node.parent.clone();
        }
        path.reverse();
        path
    }

    fn children(&self, parent: &str) -> Vec<String> {
        let mut kids: Vec<(&u64, &String)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.parent.as_deref() == Some(parent))
            .map(|(i, n)| (&n.seq, i))
            .collect();
        kids.sort();
        kids.into_iter().map(|(_, i)| i.clone()).collect()
    }
}

/// The leaf `expected` names in the store's session now.
async fn leaf_in<S: Store>(
    session: &sessiondb::Session<S>,
    expected: &ExpectedLeaf,
) -> Option<String> {
    match expected {
        ExpectedLeaf::Current => {
            let leaf = session.latest_leaf().await.unwrap();
            leaf.map(|m| m.id.to_string())
        }
        ExpectedLeaf::Empty => None,
        ExpectedLeaf::Id(p) => Some(id(*p)),
    }
}

async fn run_op<S: Store>(db: &Db<S>, session: &sessiondb::Session<S>, op: &Op) -> bool {
    match op {
        Op::Append {
            id: n,
            text,
            parent,
        } => {
            let parent = match parent {
                ParentChoice::Leaf => Parent::ActiveLeaf,
                ParentChoice::Root => Parent::Root,
                ParentChoice::Id(p) => Parent::Id(id(*p)),
            };
            let options = AppendOptions {
                parent,
                ..Default::default()
            };
            session.append(message(*n, text), options).await.is_ok()
        }
        Op::Update { id: n, text } => session
            .update(message(*n, text), Source::Server)
            .await
            .is_ok(),
        Op::Delete { ids } => {
            let ids: Vec<String> = ids.iter().map(|n| id(*n)).collect();
            session.delete(&ids).await.is_ok()
        }
        Op::Clear => session.clear().await.is_ok(),
        Op::Import {
            id: n,
            text,
            parent,
        } => {
            let options = ImportOptions {
                parent_id: parent.map(id),
                created_at: 1,
            };
            session.import(message(*n, text), options).await.is_ok()
        }
        Op::Compact { from, to } => session
            .add_compaction("summary".into(), id(*from), id(*to))
            .await
            .is_ok(),
        Op::AppendIfLeaf {
            id: n,
            text,
            expected,
        } => {
            let options = AppendOptions {
                condition: Some(WriteCondition::Leaf(leaf_in(session, expected).await)),
                ..Default::default()
            };
            session.append(message(*n, text), options).await.is_ok()
        }
        Op::ImportTogether { parts, expected } => {
            let mut if_leaf = match expected {
                Some(expected) => Some(leaf_in(session, expected).await),
                None => None,
            };
            let parts = parts.iter().map(|imports| ImportPart {
                session_id: session.key().session_id.clone(),
                lines: imports
                    .iter()
                    .map(|(n, text, parent, replace)| ImportLine::Message {
                        message: message(*n, text),
                        parent_id: parent.map(id),
                        created_at: Some(1),
                        updated_at: None,
                        replace: *replace,
                    })
                    .collect(),
                condition: if_leaf.take().map(WriteCondition::Leaf),
            });
            db.import_together("", parts.collect()).await.is_ok()
        }
    }
}

async fn compare<S: Store>(
    db: &Db<S>,
    session: &sessiondb::Session<S>,
    model: &Model,
) -> Result<(), TestCaseError> {
    let compactions = session.compactions().await.unwrap();
    prop_assert_eq!(compactions.len(), model.compactions.len());
    let summary_ids: Vec<String> = compactions
        .iter()
        .map(|c| format!("compaction_{}", c.id))
        .collect();
    let shown_ids = |path: &[String]| -> Vec<String> {
        model
            .overlaid(path)
            .into_iter()
            .map(|item| match item {
                Shown::Row(id) => id,
                Shown::Summary(c) => summary_ids[c].clone(),
            })
            .collect()
    };
    let expected = model.path(model.leaf.as_deref());
    let shown = shown_ids(&expected);
    let forward = session
        .full_history(HistoryOptions::default())
        .await
        .unwrap();
    prop_assert_eq!(ids(&forward), shown.clone());
    for m in forward
        .iter()
        .filter(|m| model.nodes.contains_key(m.id.as_str()))
    {
        let node = &model.nodes[m.id.as_str()];
        let value = m.to_value();
        prop_assert_eq!(value["parts"][0]["text"].as_str(), Some(node.text.as_str()));
    }
    let newest = session
        .full_history(HistoryOptions {
            leaf: None,
            newest_first: true,
        })
        .await
        .unwrap();
    let mut reversed = shown.clone();
    reversed.reverse();
    prop_assert_eq!(ids(&newest), reversed);
    // The streamed reads (bounded windows) show what the whole-path reads show.
    for newest_first in [false, true] {
        let options = HistoryOptions {
            leaf: None,
            newest_first,
        };
        let streamed: Vec<StoredMessage> = session.history(options).try_collect().await.unwrap();
        let whole = if newest_first { &newest } else { &forward };
        prop_assert_eq!(ids(&streamed), ids(whole));
        // Summaries are stamped with the time of the read; rows are the same rows.
        let rows = |messages: &[StoredMessage]| -> Vec<StoredMessage> {
            messages.iter().filter(|m| m.seq > 0).cloned().collect()
        };
        prop_assert_eq!(rows(&streamed), rows(whole));
    }
    // The active path's runs are its walked seqs too (the session row's dense range may hold
    // gaps left by deletes; runs never do).
    let key = session.key();
    let walked = db.store().path(key, None).await.unwrap();
    let runs = db.store().path_runs(key, None, &[]).await.unwrap();
    prop_assert_eq!(&runs.runs, &crate::runs_of(&walked.rows));
    let leaf = session.latest_leaf().await.unwrap().map(|m| m.id.clone());
    prop_assert_eq!(leaf.as_deref(), model.leaf.as_deref());

    let rows = session.row_stats(None).await.unwrap();
    let row_ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    prop_assert_eq!(&row_ids, &expected);
    let bytes: Vec<u64> = expected
        .iter()
        .map(|i| {
            let n = &model.nodes[i];
            body_bytes(n.n, &n.text)
        })
        .collect();
    prop_assert_eq!(
        rows.iter().map(|r| r.bytes).collect::<Vec<_>>(),
        bytes.clone()
    );

    let stats = session.stats().await.unwrap();
    prop_assert_eq!(stats.message_count as usize, expected.len());
    prop_assert_eq!(stats.stored_messages as usize, model.nodes.len());
    prop_assert_eq!(stats.content_bytes, bytes.iter().sum::<u64>());
    prop_assert_eq!(
        stats.token_estimate,
        rows.iter().map(|r| r.token_estimate).sum::<u64>()
    );

    // A budget of about half the path: the longest fitting suffix, never less than the leaf.
    // (Budgets over overlaid paths are checked by the compaction cases.)
    let total: u64 = bytes.iter().sum();
    let budget = total / 2;
    if model.compactions.is_empty() {
        let recent = session.recent_history(budget, None).await.unwrap();
        let mut start = bytes.len();
        let mut used = 0;
        while start > 0 && (start == bytes.len() || used + bytes[start - 1] <= budget) {
            used += bytes[start - 1];
            start -= 1;
        }
        prop_assert_eq!(ids(&recent.messages), expected[start..].to_vec());
        prop_assert_eq!(recent.truncated, start > 0);
        prop_assert_eq!(recent.total_bytes, total);
    }

    // The full-text index holds every message's current text and nothing else (deleted,
    // cleared and replaced texts leave it).
    for word in WORDS {
        let hits = session.search(word, 100).await.unwrap();
        let mut found: Vec<(&str, &str)> = hits
            .iter()
            .map(|h| (h.id.as_str(), h.content.as_str()))
            .collect();
        found.sort();
        let expected: Vec<(&str, &str)> = model
            .nodes
            .iter()
            .filter(|(_, node)| node.text.split(' ').any(|w| w == word))
            .map(|(id, node)| (id.as_str(), node.text.as_str()))
            .collect();
        prop_assert_eq!(found, expected, "search for {}", word);
    }

    for n in 0..ID_POOL {
        let stored = session.message(&id(n)).await.unwrap();
        match model.nodes.get(&id(n)) {
            Some(node) => {
                let stored = stored.expect("message the model holds");
                prop_assert_eq!(stored.parent_id.as_deref(), node.parent.as_deref());
                prop_assert_eq!(
                    ids(&session.branches(&id(n)).await.unwrap()),
                    model.children(&id(n))
                );
                let path = model.path(Some(&id(n)));
                prop_assert_eq!(
                    ids(&session
                        .full_history(HistoryOptions {
                            leaf: Some(id(n)),
                            newest_first: false
                        })
                        .await
                        .unwrap()),
                    shown_ids(&path)
                );
                // The runs a backend plans overlays on are the walked path's seqs, and
                // the rows it locates are the rows there are.
                let key = session.key();
                let walked = db.store().path(key, Some(&id(n))).await.unwrap();
                let runs = db
                    .store()
                    .path_runs(key, Some(&id(n)), &[id(n), "ghost".into()])
                    .await
                    .unwrap();
                prop_assert_eq!(&runs.runs, &crate::runs_of(&walked.rows));
                prop_assert_eq!(runs.capped, walked.capped);
                prop_assert_eq!(&runs.located, &vec![Some(stored.seq), None]);
            }
            None => prop_assert!(stored.is_none()),
        }
    }
    Ok(())
}

/// The session's export imported into a new session exports the same lines (the session line
/// naming the copy): whatever the ops left (branches, spliced deletes, orphans, updates,
/// compactions, a cleared tree), a store moves session by session without a difference.
async fn reimports_byte_for_byte<S: Store>(
    db: &Db<S>,
    session: &sessiondb::Session<S>,
) -> Result<(), TestCaseError> {
    async fn export<S: Store>(s: &sessiondb::Session<S>) -> String {
        s.export()
            .try_collect::<Vec<String>>()
            .await
            .unwrap()
            .concat()
    }
    let original = export(session).await;
    let copy = db.session("copy").unwrap();
    copy.import_lines(sessiondb::parse_import(&original).unwrap())
        .await
        .unwrap();
    let copied = export(&copy).await;
    prop_assert_eq!(
        copied.replacen(r#""id":"copy""#, r#""id":"model""#, 1),
        original
    );
    Ok(())
}

/// Runs `cases` random op sequences, each against a fresh store from `open`.
pub fn check_against_model<S: Store, G>(open: impl Fn() -> (Db<S>, G), cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let ops = proptest::collection::vec(op_strategy(), 1..40);
    runner
        .run(&ops, |ops| {
            let (db, _guard) = open();
            let session = db.session("model").unwrap();
            let mut model = Model::default();
            block_on(async {
                // Conditioned appends need the session to exist from the start.
                db.create_session("", Some("model".into()), Default::default())
                    .await
                    .unwrap();
                for op in &ops {
                    let accepted = model.apply(op);
                    prop_assert_eq!(run_op(&db, &session, op).await, accepted, "op {:?}", op);
                    compare(&db, &session, &model).await?;
                }
                reimports_byte_for_byte(&db, &session).await
            })
        })
        .unwrap();
}
