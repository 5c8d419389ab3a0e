//! Compaction overlays on a path: which rows a read shows, and where a summary stands in for a
//! span of rows.

use crate::COMPACTION_PREFIX;
use crate::registry::Compaction;

/// A stretch of an overlaid path, root first; `first..=last` are path positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathSpan {
    /// Path rows shown as stored.
    Rows { first: usize, last: usize },
    /// The summary of `compactions[compaction]`, standing for these path rows.
    Summary {
        compaction: usize,
        first: usize,
        last: usize,
    },
}

/// Where one compaction's endpoints are on a path (`None`: not on it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Endpoints {
    pub from: Option<usize>,
    pub to: Option<usize>,
}

/// Plans the overlays of a path of `len` rows from where the compactions' endpoints are on it
/// (`ends[i]` for `compactions[i]`, creation order) and which positions hold echoes to hide.
/// Walking from the root, a row where compactions start whose end lies further down this path
/// begins a span; the newest such compaction wins and the walk resumes after its end. So an
/// overlay whose end is on another branch never applies, and one that starts inside a chosen span
/// is skipped. Needs only the endpoints, so a reader never has to load the path's rows to plan.
pub fn overlay_spans(len: usize, ends: &[Endpoints], hidden: &[usize]) -> Vec<PathSpan> {
    let mut starts: Vec<(usize, usize)> = ends
        .iter()
        .enumerate()
        .filter_map(|(c, e)| e.from.map(|from| (from, c)))
        .collect();
    // Newest first among compactions starting at the same row.
    starts.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut hidden = hidden.to_vec();
    hidden.sort_unstable();
    let mut spans = Vec::new();
    let shown_rows = |from: usize, to_exclusive: usize, spans: &mut Vec<PathSpan>| {
        let mut first = from;
        for &h in hidden.iter().filter(|&&h| h >= from && h < to_exclusive) {
            if h > first {
                spans.push(PathSpan::Rows { first, last: h - 1 });
            }
            first = h + 1;
        }
        if first < to_exclusive {
            spans.push(PathSpan::Rows {
                first,
                last: to_exclusive - 1,
            });
        }
    };
    let mut i = 0;
    for &(start, c) in &starts {
        if start < i || start >= len {
            continue;
        }
        let Some(end) = ends[c].to.filter(|&end| end >= start && end < len) else {
            continue;
        };
        shown_rows(i, start, &mut spans);
        spans.push(PathSpan::Summary {
            compaction: c,
            first: start,
            last: end,
        });
        i = end + 1;
    }
    shown_rows(i, len, &mut spans);
    spans
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

    /// Endpoints of `compactions` on a path given by its ids, root first.
    fn ends_on(path: &[&str], compactions: &[Compaction]) -> Vec<Endpoints> {
        let at = |id: &str| path.iter().position(|p| *p == id);
        compactions
            .iter()
            .map(|c| Endpoints {
                from: at(&c.from_message_id),
                to: at(&c.to_message_id),
            })
            .collect()
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
            overlay_spans(path.len(), &ends_on(&path, &cs), &[]),
            [
                PathSpan::Summary {
                    compaction: 1,
                    first: 0,
                    last: 2
                },
                PathSpan::Rows { first: 3, last: 4 },
            ]
        );
    }

    #[test]
    fn spans_split_around_hidden_rows_and_skip_ends_off_the_path() {
        let ends = [
            Endpoints {
                from: Some(2),
                to: Some(4),
            },
            Endpoints {
                from: Some(6),
                to: None,
            },
            Endpoints {
                from: Some(3),
                to: Some(8),
            },
        ];
        assert_eq!(
            overlay_spans(10, &ends, &[1, 7, 9]),
            [
                PathSpan::Rows { first: 0, last: 0 },
                PathSpan::Summary {
                    compaction: 0,
                    first: 2,
                    last: 4
                },
                PathSpan::Rows { first: 5, last: 6 },
                PathSpan::Rows { first: 8, last: 8 },
            ]
        );
    }

    #[test]
    fn an_end_above_the_start_never_applies_and_echoes_are_hidden() {
        let path = ["a", "compaction_1", "b", "compaction_other"];
        let cs = [compaction("1", "b", "a")];
        let hidden: Vec<usize> = (0..path.len())
            .filter(|&i| is_hidden(path[i], &cs))
            .collect();
        assert_eq!(hidden, [1]);
        assert_eq!(
            overlay_spans(path.len(), &ends_on(&path, &cs), &hidden),
            [
                PathSpan::Rows { first: 0, last: 0 },
                PathSpan::Rows { first: 2, last: 3 },
            ]
        );
    }
}
