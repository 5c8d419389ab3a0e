//! Row chunking: a message body larger than [`crate::MAX_SLICE_BYTES`] is stored as slice 0 in the
//! message row plus continuation rows. Joining the slices in order gives the body back byte-exact.

/// Splits `text` into slices of at most `budget` UTF-8 bytes, never inside a character.
///
/// Invariants: the slices concatenate to `text`; an empty text is one empty slice; every other
/// slice is non-empty; a slice exceeds `budget` only when it is a single character wider than the
/// budget (possible only for budgets below 4).
pub fn split_slices(text: &str, budget: usize) -> Vec<&str> {
    if text.is_empty() {
        return vec![""];
    }
    let budget = budget.max(1);
    let mut slices = Vec::with_capacity(text.len() / budget + 1);
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = budget.min(rest.len());
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            // One character wider than the budget gets a slice of its own.
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (slice, tail) = rest.split_at(end);
        slices.push(slice);
        rest = tail;
    }
    slices
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_text_is_one_empty_slice() {
        assert_eq!(split_slices("", 16), vec![""]);
    }

    #[test]
    fn fitting_text_is_one_slice() {
        assert_eq!(split_slices("hello", 16), vec!["hello"]);
    }

    #[test]
    fn five_million_ascii_chars_make_four_slices() {
        let text = "a".repeat(5_000_000);
        assert_eq!(split_slices(&text, crate::MAX_SLICE_BYTES).len(), 4);
        let text = "a".repeat(2_000_000);
        assert_eq!(split_slices(&text, crate::MAX_SLICE_BYTES).len(), 2);
    }

    #[test]
    fn wide_char_under_tiny_budget_stands_alone() {
        assert_eq!(split_slices("😀a", 2), vec!["😀", "a"]);
    }

    fn check(text: &str, budget: usize) {
        let slices = split_slices(text, budget);
        assert_eq!(slices.concat(), text);
        for s in &slices {
            assert!(
                s.len() <= budget || s.chars().count() == 1,
                "slice {s:?} over {budget}"
            );
            if !text.is_empty() {
                assert!(!s.is_empty());
            }
        }
        // Maximality: a slice is only closed when the next character would not fit.
        for pair in slices.windows(2) {
            let next = pair[1].chars().next().unwrap();
            assert!(pair[0].len() + next.len_utf8() > budget);
        }
    }

    proptest! {
        #[test]
        fn ascii_round_trips(text in "[ -~]{0,200}", budget in 1usize..40) {
            check(&text, budget);
        }

        #[test]
        fn emoji_round_trips(text in "[😀-🙏🚀-🛿]{0,80}", budget in 1usize..40) {
            check(&text, budget);
            for s in split_slices(&text, budget.max(4)) {
                prop_assert_eq!(s.len() % 4, 0);
            }
        }

        #[test]
        fn cjk_and_mixed_round_trip(text in "[a-z一-龥😀-🙏é ]{0,120}", budget in 1usize..40) {
            check(&text, budget);
        }
    }
}
