//! Cursor pagination shared by session listings and message lists.
//!
//! A page is read in one direction (`ascending` or not); `after` continues past a page's
//! `next_cursor`, `before` goes back from a page's `previous_cursor` (items still come in the
//! requested order). The two are mutually exclusive.

use sessiondb_core::{ValidationError, ValidationErrorKind};

/// Most items one page holds; pages hold 1..=MAX_PAGE_SIZE.
pub const MAX_PAGE_SIZE: usize = 100;
pub const DEFAULT_PAGE_SIZE: usize = 20;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PageRequest {
    pub limit: Option<usize>,
    /// Newest (or highest) first.
    pub descending: bool,
    pub after: Option<String>,
    pub before: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `after` for the following page; absent on the last page.
    pub next_cursor: Option<String>,
    /// Pass as `before` for the preceding page; absent on the first page.
    pub previous_cursor: Option<String>,
}

/// Which way a page request reads from its cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Direction<'a> {
    /// From the start, or past an `after` cursor, in the requested order.
    Forward(Option<&'a str>),
    /// Back from a `before` cursor.
    Backward(&'a str),
}

impl PageRequest {
    /// The validated page size and direction.
    pub(crate) fn checked(&self) -> Result<(usize, Direction<'_>), ValidationError> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE_SIZE);
        if !(1..=MAX_PAGE_SIZE).contains(&limit) {
            return Err(ValidationError::new(
                "limit",
                ValidationErrorKind::WrongType {
                    expected: "an integer from 1 to 100",
                },
            ));
        }
        let direction = match (&self.after, &self.before) {
            (Some(_), Some(_)) => {
                return Err(ValidationError::new(
                    "before",
                    ValidationErrorKind::WrongType {
                        expected: "absent when `after` is given",
                    },
                ));
            }
            (None, Some(before)) => Direction::Backward(before),
            (after, None) => Direction::Forward(after.as_deref()),
        };
        Ok((limit, direction))
    }
}

/// Builds a page from up to `limit + 1` items read in `direction` (reading backward, they come
/// nearest the cursor first). `cursor_of` makes an item's cursor.
pub(crate) fn assemble<T>(
    mut read: Vec<T>,
    limit: usize,
    direction: &Direction<'_>,
    cursor_of: impl Fn(&T) -> String,
) -> Page<T> {
    let more = read.len() > limit;
    read.truncate(limit);
    let (items, has_next, has_previous) = match direction {
        Direction::Forward(after) => (read, more, after.is_some()),
        Direction::Backward(_) => {
            read.reverse();
            (read, true, more)
        }
    };
    Page {
        next_cursor: has_next.then(|| items.last().map(&cursor_of)).flatten(),
        previous_cursor: has_previous
            .then(|| items.first().map(&cursor_of))
            .flatten(),
        items,
    }
}

pub(crate) fn invalid_cursor(field: &str) -> ValidationError {
    ValidationError::new(
        field,
        ValidationErrorKind::WrongType {
            expected: "a cursor from an earlier page",
        },
    )
}

/// Session cursors are `(sort value, id)` as hex text, so any id survives a URL.
pub(crate) fn encode_cursor(value: i64, id: &str) -> String {
    let text = format!("{value}:{id}");
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn decode_cursor(field: &str, cursor: &str) -> Result<(i64, String), ValidationError> {
    let bytes: Option<Vec<u8>> = cursor
        .len()
        .is_multiple_of(2)
        .then(|| {
            (0..cursor.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten();
    let text = bytes.and_then(|b| String::from_utf8(b).ok());
    text.and_then(|t| {
        let (value, id) = t.split_once(':')?;
        // Cursors name stored sessions, whose ids never hold control characters.
        let id = Some(id).filter(|id| !id.contains(char::is_control))?;
        Some((value.parse().ok()?, id.to_owned()))
    })
    .ok_or_else(|| invalid_cursor(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let c = encode_cursor(-5, "a:b/ü");
        assert_eq!(
            decode_cursor("after", &c).unwrap(),
            (-5, "a:b/ü".to_owned())
        );
        for bad in ["", "zz", "abc", "3a"] {
            assert!(decode_cursor("after", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pages_carry_cursors_only_where_items_remain() {
        let first = assemble(vec![1, 2, 3], 2, &Direction::Forward(None), |n| {
            n.to_string()
        });
        assert_eq!(
            (first.items, first.next_cursor, first.previous_cursor),
            (vec![1, 2], Some("2".into()), None)
        );
        let last = assemble(vec![3], 2, &Direction::Forward(Some("2")), |n| {
            n.to_string()
        });
        assert_eq!(
            (last.items, last.next_cursor, last.previous_cursor),
            (vec![3], None, Some("3".into()))
        );
        let back = assemble(vec![2, 1], 2, &Direction::Backward("3"), |n| n.to_string());
        assert_eq!(
            (back.items, back.next_cursor, back.previous_cursor),
            (vec![1, 2], Some("2".into()), None)
        );
    }
}
