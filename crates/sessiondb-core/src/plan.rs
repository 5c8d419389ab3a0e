//! Read planning and delete splicing: pure functions over row statistics and parent links.

use std::collections::HashMap;
use std::ops::Range;

use crate::MAX_PATH_ROWS;
use crate::store::PlanRow;

/// Cuts a path (root → leaf) into content windows of at most `max_rows` rows and `max_bytes`
/// stored bytes. A row larger than `max_bytes` forms a window of its own, so memory held by a
/// forward read is bounded by one window, whatever the session's size.
pub fn content_windows(rows: &[PlanRow], max_rows: usize, max_bytes: u64) -> Vec<Range<usize>> {
    let max_rows = max_rows.max(1);
    let mut windows = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, row) in rows.iter().enumerate() {
        let full = i - start == max_rows || (i > start && bytes + row.bytes > max_bytes);
        if full {
            windows.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += row.bytes;
    }
    if start < rows.len() {
        windows.push(start..rows.len());
    }
    windows
}

/// Admits path rows newest first while they fit a byte budget; the first row (the leaf) is
/// always admitted, so a non-empty path always yields at least its leaf.
#[derive(Debug, Clone)]
pub struct SuffixBudget {
    max_bytes: u64,
    used: u64,
    admitted: usize,
}

impl SuffixBudget {
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            used: 0,
            admitted: 0,
        }
    }

    /// Whether the next older row of `bytes` still fits; once a row is refused, callers stop.
    pub fn admit(&mut self, bytes: u64) -> bool {
        if self.admitted > 0 && self.used.saturating_add(bytes) > self.max_bytes {
            return false;
        }
        self.used = self.used.saturating_add(bytes);
        self.admitted += 1;
        true
    }
}

/// Groups a message stream into batches of at most `batch_size` messages and about `max_bytes`
/// bytes; a message larger than `max_bytes` is a batch of its own. Batches are never empty.
#[derive(Debug)]
pub struct Batcher<T> {
    batch_size: usize,
    max_bytes: u64,
    items: Vec<T>,
    bytes: u64,
}

impl<T> Batcher<T> {
    pub fn new(batch_size: usize, max_bytes: u64) -> Self {
        Self {
            batch_size: batch_size.max(1),
            max_bytes: max_bytes.max(1),
            items: Vec::new(),
            bytes: 0,
        }
    }

    /// Adds an item of `bytes` size; returns the batches it completed (zero, one or two).
    pub fn push(&mut self, item: T, bytes: u64) -> Vec<Vec<T>> {
        let mut done = Vec::new();
        if !self.items.is_empty()
            && (self.items.len() >= self.batch_size || self.bytes + bytes > self.max_bytes)
        {
            done.extend(self.take());
        }
        self.items.push(item);
        self.bytes += bytes;
        if self.items.len() >= self.batch_size || self.bytes >= self.max_bytes {
            done.extend(self.take());
        }
        done
    }

    /// The remaining partial batch, if any.
    pub fn take(&mut self) -> Option<Vec<T>> {
        self.bytes = 0;
        (!self.items.is_empty()).then(|| std::mem::take(&mut self.items))
    }
}

/// Aggregates of a (capped) path, as a backend keeps them on its session row so stats are O(1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathTotals {
    pub len: u64,
    pub tokens: u64,
    pub bytes: u64,
    /// The oldest row read still has a parent.
    pub capped: bool,
    /// Seq of the oldest row read.
    pub head_seq: Option<i64>,
    /// The path is exactly the rows with seq >= `head_seq`.
    pub dense: bool,
}

impl PathTotals {
    /// The path of an empty session: nothing, trivially dense.
    pub const EMPTY: PathTotals = PathTotals {
        len: 0,
        tokens: 0,
        bytes: 0,
        capped: false,
        head_seq: None,
        dense: true,
    };

    /// The path of a new root, alone on it and the session's newest row.
    pub fn lone_root(seq: i64, tokens: u64, bytes: u64) -> Self {
        PathTotals {
            len: 1,
            tokens,
            bytes,
            capped: false,
            head_seq: Some(seq),
            dense: true,
        }
    }

    /// Adds a new leaf `seq` that extends this path. A full path ([`MAX_PATH_ROWS`]) is left
    /// alone and false returned: its head must drop out first ([`PathTotals::slide`]).
    pub fn extend(&mut self, seq: i64, tokens: u64, bytes: u64) -> bool {
        if self.len as usize >= MAX_PATH_ROWS {
            return false;
        }
        self.len += 1;
        self.tokens += tokens;
        self.bytes += bytes;
        self.head_seq = self.head_seq.or(Some(seq));
        true
    }

    /// A full path grows at its leaf: the head (`head_tokens`, `head_bytes`) drops out and its
    /// only child `next_head` becomes the head; the length stays at the cap.
    pub fn slide(
        &mut self,
        (head_tokens, head_bytes): (u64, u64),
        next_head: i64,
        (tokens, bytes): (u64, u64),
    ) {
        self.tokens = self.tokens.saturating_sub(head_tokens) + tokens;
        self.bytes = self.bytes.saturating_sub(head_bytes) + bytes;
        self.head_seq = Some(next_head);
        self.capped = true;
    }
}

/// The active path as a seq range `(first, last)` when the session row says it is dense.
pub fn linear_range(leaf: Option<i64>, head: Option<i64>, dense: bool) -> Option<(i64, i64)> {
    match (head, leaf) {
        (Some(first), Some(last)) if dense => Some((first, last)),
        _ => None,
    }
}

/// Computes the parent rewrites of a delete.
///
/// `deleted` maps each deleted id to its parent; `children` lists `(child, parent)` for the
/// surviving children of deleted rows. Each such child moves to its nearest surviving ancestor:
/// the first id up the deleted chain that is not itself deleted (or `None`: it becomes a root).
/// Walks stop after `max_depth` steps so corrupt parent cycles cannot hang a delete.
pub fn splice_rewires(
    deleted: &HashMap<String, Option<String>>,
    children: &[(String, String)],
    max_depth: usize,
) -> Vec<(String, Option<String>)> {
    children
        .iter()
        .filter(|(child, _)| !deleted.contains_key(child))
        .map(|(child, parent)| {
            let mut ancestor = Some(parent.clone());
            let mut steps = 0;
            while let Some(id) = &ancestor {
                match deleted.get(id) {
                    Some(grandparent) if steps < max_depth => {
                        ancestor = grandparent.clone();
                        steps += 1;
                    }
                    Some(_) => {
                        ancestor = None;
                        break;
                    }
                    None => break,
                }
            }
            (child.clone(), ancestor)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(bytes: &[u64]) -> Vec<PlanRow> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| PlanRow {
                seq: i as i64,
                bytes: b,
            })
            .collect()
    }

    #[test]
    fn windows_respect_rows_and_bytes() {
        assert_eq!(
            content_windows(&rows(&[1; 120]), 50, 1000),
            vec![0..50, 50..100, 100..120]
        );
        assert_eq!(
            content_windows(&rows(&[6, 6, 6]), 50, 10),
            vec![0..1, 1..2, 2..3]
        );
        assert_eq!(
            content_windows(&rows(&[2, 20, 2, 2]), 50, 10),
            vec![0..1, 1..2, 2..4]
        );
        assert!(content_windows(&rows(&[]), 50, 10).is_empty());
    }

    #[test]
    fn suffix_budget_keeps_the_leaf_and_stops_at_the_first_misfit() {
        let fits = |budget: u64, sizes: &[u64]| {
            let mut b = SuffixBudget::new(budget);
            sizes.iter().take_while(|&&s| b.admit(s)).count()
        };
        assert_eq!(fits(30, &[10; 6]), 3);
        assert_eq!(fits(1, &[10; 6]), 1);
        assert_eq!(fits(1000, &[10; 6]), 6);
        assert_eq!(fits(25, &[10, 20, 1]), 1);
    }

    #[test]
    fn batches_follow_count_then_bytes() {
        let mut b = Batcher::new(2, 1000);
        let mut sizes = Vec::new();
        for i in 0..5 {
            sizes.extend(b.push(i, 10).into_iter().map(|v| v.len()));
        }
        sizes.extend(b.take().map(|v| v.len()));
        assert_eq!(sizes, [2, 2, 1]);
        let mut b = Batcher::new(50, 11);
        let mut n = 0;
        for i in 0..5 {
            n += b.push(i, 10).len();
        }
        n += usize::from(b.take().is_some());
        assert_eq!(n, 5);
    }

    #[test]
    fn splice_moves_children_to_nearest_survivor() {
        // root → a → b → c ; b → d. Delete a, b.
        let deleted: HashMap<_, _> = [
            ("a".to_string(), Some("root".to_string())),
            ("b".to_string(), Some("a".to_string())),
        ]
        .into();
        let children = [
            ("b".to_string(), "a".to_string()),
            ("c".to_string(), "b".to_string()),
            ("d".to_string(), "b".to_string()),
        ];
        let mut rewires = splice_rewires(&deleted, &children, 100);
        rewires.sort();
        assert_eq!(
            rewires,
            vec![
                ("c".into(), Some("root".into())),
                ("d".into(), Some("root".into()))
            ]
        );
        let deleted: HashMap<_, _> = [("root".to_string(), None)].into();
        let rewires = splice_rewires(&deleted, &[("a".into(), "root".into())], 100);
        assert_eq!(rewires, vec![("a".into(), None)]);
    }
}
