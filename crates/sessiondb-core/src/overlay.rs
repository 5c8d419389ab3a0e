//! Compaction overlays on a path: which rows a read shows, and where a summary stands in for a
//! span of rows.

use std::collections::HashMap;

use crate::COMPACTION_PREFIX;
use crate::registry::Compaction;

/// One element of an overlaid path, root first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathItem {
    /// The path row at this index, shown as stored.
    Row(usize),
    /// The summary of `compactions[index]`, standing for the rows `first..=last` of the path.
    Summary {
        compaction: usize,
        first: usize,
        last: usize,
    },
}

/// Plans the overlays of a path (`path_ids` root first) given a session's compactions in creation
/// order. Walking from the root, a row where compactions start whose end lies further down this
/// path begins a span; the newest such compaction wins and the walk resumes after its end. So an
/// overlay whose end is on another branch never applies, and one that starts inside a chosen span
/// is skipped. Stored rows that are echoes of this session's own overlays (`compaction_<id>`) are
/// hidden.
pub fn overlay_path(path_ids: &[&str], compactions: &[Compaction]) -> Vec<PathItem> {
    let position: HashMap<&str, usize> = path_ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, i))
        .collect();
    let mut starting_at: HashMap<&str, Vec<usize>> = HashMap::new();
    for (index, c) in compactions.iter().enumerate() {
        starting_at
            .entry(c.from_message_id.as_str())
            .or_default()
            .push(index);
    }
    let mut items = Vec::with_capacity(path_ids.len());
    let mut i = 0;
    while i < path_ids.len() {
        let chosen = starting_at.get(path_ids[i]).and_then(|candidates| {
            candidates.iter().rev().find_map(|&c| {
                let end = *position.get(compactions[c].to_message_id.as_str())?;
                (end >= i).then_some((c, end))
            })
        });
        match chosen {
            Some((compaction, last)) => {
                items.push(PathItem::Summary {
                    compaction,
                    first: i,
                    last,
                });
                i = last + 1;
            }
            None => {
                if !is_hidden(path_ids[i], compactions) {
                    items.push(PathItem::Row(i));
                }
                i += 1;
            }
        }
    }
    items
}

/// True when `id` has the synthetic prefix, so it could be hidden (a cheap check before reading a
/// session's compactions).
pub fn may_be_hidden(id: &str) -> bool {
    id.starts_with(COMPACTION_PREFIX)
}

/// True for a stored row whose id is the synthetic id of one of these compactions.
pub fn is_hidden(id: &str, compactions: &[Compaction]) -> bool {
    id.strip_prefix(COMPACTION_PREFIX)
        .is_some_and(|rest| compactions.iter().any(|c| c.id == rest))
}

/// The id of the synthetic message that stands for a compaction.
pub fn summary_message_id(compaction: &Compaction) -> String {
    format!("{COMPACTION_PREFIX}{}", compaction.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compaction(id: &str, from: &str, to: &str) -> Compaction {
        Compaction {
            id: id.into(),
            summary: format!("summary {id}"),
            from_message_id: from.into(),
            to_message_id: to.into(),
            created_at: 0,
        }
    }

    #[test]
    fn newest_overlay_at_a_row_wins_and_overlaps_inside_are_skipped() {
        let path = ["a", "b", "c", "d", "e"];
        let cs = [
            compaction("1", "a", "b"),
            compaction("2", "a", "c"),
            compaction("3", "b", "d"),
            compaction("4", "d", "elsewhere"),
        ];
        assert_eq!(
            overlay_path(&path, &cs),
            [
                PathItem::Summary {
                    compaction: 1,
                    first: 0,
                    last: 2
                },
                PathItem::Row(3),
                PathItem::Row(4)
            ]
        );
    }

    #[test]
    fn an_end_above_the_start_never_applies_and_echoes_are_hidden() {
        let path = ["a", "compaction_1", "b", "compaction_other"];
        let cs = [compaction("1", "b", "a")];
        assert_eq!(
            overlay_path(&path, &cs),
            [PathItem::Row(0), PathItem::Row(2), PathItem::Row(3)]
        );
    }
}
