//! Snippets: the part of a search hit's text around the words that matched, with those words
//! marked, so a result list or an agent's recall shows why a message was found without carrying
//! the whole message.
//!
//! A word of the text matches a query word when both stem alike after folding (lower case,
//! diacritics removed), by the Porter stemmer of SQLite's FTS5 (`porter unicode61`): the words
//! the embedded store's index matched. PostgreSQL stems with Snowball's English stemmer, which
//! agrees on nearly every word; a hit whose words the two stem differently shows the start of
//! its text unmarked.

use std::ops::Range;

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use crate::porter;
use crate::search::{query_words, words};

/// Words a snippet holds unless asked for another number.
pub const DEFAULT_SNIPPET_WORDS: usize = 16;
/// Most words a snippet may be asked to hold.
pub const MAX_SNIPPET_WORDS: usize = 100;
/// A word or a run between words longer than this many characters is cut, ending in `…`.
const MAX_RUN_CHARS: usize = 64;
/// Where a snippet leaves text out.
const ELLIPSIS: char = '…';

/// The stems of a query's words, to find and mark them in texts.
#[derive(Debug, Clone)]
pub struct Highlighter {
    stems: Vec<Vec<u8>>,
    /// Which first bytes a word needs to be looked at further: the stems' (in either case)
    /// and every non-ASCII byte (folding may make it one of them).
    may_start: [bool; 256],
}

impl Highlighter {
    /// The words of `query` as [`query_words`] cuts them.
    pub fn new(query: &str) -> Self {
        let mut stems: Vec<Vec<u8>> = Vec::new();
        let mut folded = Vec::new();
        for word in query_words(query) {
            fold(&word, &mut folded);
            porter::stem(&mut folded);
            if !folded.is_empty() && !stems.contains(&folded) {
                stems.push(folded.clone());
            }
        }
        let mut may_start = [false; 256];
        for byte in 0..=255u8 {
            may_start[usize::from(byte)] = !byte.is_ascii()
                || stems
                    .iter()
                    .any(|stem| stem[0] == byte.to_ascii_lowercase());
        }
        Highlighter { stems, may_start }
    }

    /// Which of the query's words `word` is, if any (its index among the stems). Most words
    /// are told apart by their first byte before folding, the rest by their first bytes before
    /// stemming.
    fn matches(&self, word: &str, folded: &mut Vec<u8>) -> Option<usize> {
        if !self.may_start[usize::from(word.as_bytes()[0])] {
            return None;
        }
        fold(word, folded);
        if !self.stems.iter().any(|stem| may_stem_to(folded, stem)) {
            return None;
        }
        porter::stem(folded);
        self.stems.iter().position(|stem| stem == folded)
    }

    /// The part of `text` of at most `max_words` words (at least one) that holds the most of the
    /// query's different words (then the most matches; the earliest of equals), centred on them,
    /// as pieces that alternate between plain text and a matched word: even positions plain
    /// (possibly empty), odd positions matched, so joined they read as the excerpt. `…` stands
    /// where text was left out, runs of white space read as one space, and a word or a run
    /// between words longer than 64 characters is cut. Without a match, the text's start.
    pub fn snippet(&self, text: &str, max_words: usize) -> Vec<String> {
        let max_words = max_words.max(1);
        let mut folded = Vec::new();
        let spans: Vec<(usize, usize)> = words(text).collect();
        // (word index, stem index) of every match, in order.
        let found: Vec<(usize, usize)> = (spans.iter().enumerate())
            .filter_map(|(index, &(start, end))| {
                Some((index, self.matches(&text[start..end], &mut folded)?))
            })
            .collect();
        excerpt(
            text,
            &spans,
            self.window(&found, spans.len(), max_words),
            &found,
        )
    }

    /// Which words the snippet shows (see [`Highlighter::snippet`]), of `word_count`, given
    /// the (word index, stem index) of every match.
    fn window(
        &self,
        found: &[(usize, usize)],
        word_count: usize,
        max_words: usize,
    ) -> Range<usize> {
        if word_count <= max_words {
            return 0..word_count;
        }
        if found.is_empty() {
            return 0..max_words;
        }
        // With each match first in turn, the matches within `max_words` words of it.
        let mut counts = vec![0usize; self.stems.len()];
        let (mut distinct, mut end) = (0, 0);
        let (mut best_score, mut best) = ((0, 0), 0..1);
        for begin in 0..found.len() {
            while end < found.len() && found[end].0 < found[begin].0 + max_words {
                counts[found[end].1] += 1;
                distinct += usize::from(counts[found[end].1] == 1);
                end += 1;
            }
            if (distinct, end - begin) > best_score {
                (best_score, best) = ((distinct, end - begin), begin..end);
            }
            counts[found[begin].1] -= 1;
            distinct -= usize::from(counts[found[begin].1] == 0);
        }
        let (first_match, last_match) = (found[best.start].0, found[best.end - 1].0);
        let slack = max_words - (last_match - first_match + 1);
        let first = first_match
            .saturating_sub(slack / 2)
            .min(word_count - max_words);
        first..first + max_words
    }
}

/// The pieces of `text` showing the words `shown` of those at `spans` (see
/// [`Highlighter::snippet`]).
fn excerpt(
    text: &str,
    spans: &[(usize, usize)],
    shown: Range<usize>,
    found: &[(usize, usize)],
) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut plain = String::new();
    if shown.start > 0 {
        plain.push(ELLIPSIS);
    }
    let mut matched = found.iter().map(|&(index, _)| index).peekable();
    let mut shown_to = 0;
    for index in shown.clone() {
        let (start, end) = spans[index];
        if index > shown.start {
            push_run(&mut plain, &text[shown_to..start]);
        } else if index == 0 {
            push_run(&mut plain, text[..start].trim_start());
        }
        shown_to = end;
        while matched.next_if(|&m| m < index).is_some() {}
        if matched.next_if_eq(&index).is_some() {
            pieces.push(std::mem::take(&mut plain));
            let mut word = String::new();
            push_run(&mut word, &text[start..end]);
            pieces.push(word);
        } else {
            push_run(&mut plain, &text[start..end]);
        }
    }
    if shown.end == spans.len() {
        let tail = text[shown_to..].trim_end();
        push_run(
            &mut plain,
            if shown_to == 0 {
                tail.trim_start()
            } else {
                tail
            },
        );
    } else {
        plain.push(ELLIPSIS);
    }
    pieces.push(plain);
    pieces
}

/// Appends `run` with each stretch of white space as one space, cut after [`MAX_RUN_CHARS`].
fn push_run(out: &mut String, run: &str) {
    let mut chars = 0;
    let mut after_space = false;
    for c in run.chars() {
        if c.is_whitespace() {
            if after_space {
                continue;
            }
            after_space = true;
        } else {
            after_space = false;
        }
        if chars == MAX_RUN_CHARS - 1 {
            out.push(ELLIPSIS);
            return;
        }
        out.push(if after_space { ' ' } else { c });
        chars += 1;
    }
}

/// Whether a folded word can have `stem` as its stem: it begins as the stem does but for the
/// stem's last bytes (see [`porter::CHANGED_TAIL`]).
fn may_stem_to(word: &[u8], stem: &[u8]) -> bool {
    let kept = stem.len().saturating_sub(porter::CHANGED_TAIL).max(1);
    word.starts_with(&stem[..kept])
}

/// `word` in lower case without diacritics (its canonical decomposition without combining
/// marks), as UTF-8 bytes in `out`.
fn fold(word: &str, out: &mut Vec<u8>) {
    out.clear();
    if word.is_ascii() {
        out.extend(word.bytes().map(|b| b.to_ascii_lowercase()));
        return;
    }
    let mut buf = [0u8; 4];
    for c in word
        .nfd()
        .filter(|&c| !is_combining_mark(c))
        .flat_map(char::to_lowercase)
    {
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn snippet(query: &str, text: &str, words: usize) -> Vec<String> {
        Highlighter::new(query).snippet(text, words)
    }

    #[test]
    fn a_short_text_is_whole_with_its_stemmed_and_folded_matches_marked() {
        assert_eq!(
            snippet("run CAFE", "  The agent runs;\n\nthen the Café ran.  ", 16),
            ["The agent ", "runs", "; then the ", "Café", " ran."]
        );
        assert_eq!(snippet("runs", "running", 16), ["", "running", ""]);
        assert_eq!(snippet("absent", "nothing here", 16), ["nothing here"]);
    }

    #[test]
    fn a_long_text_is_cut_around_the_most_different_words() {
        let filler = |from: usize, n: usize| {
            (from..from + n)
                .map(|i| format!("w{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        // `pizza` alone early; `pizza` and `order` together later: the later window wins.
        let text = format!(
            "{} pizza {} order the pizza now {}",
            filler(0, 5),
            filler(5, 40),
            filler(45, 40)
        );
        let pieces = snippet("pizza orders", &text, 8);
        assert_eq!(
            pieces,
            ["…w43 w44 ", "order", " the ", "pizza", " now w45 w46…"]
        );
        // The window never runs past the end.
        let pieces = snippet("last", &format!("{} last", filler(0, 30)), 4);
        assert_eq!(pieces, ["…w27 w28 w29 ", "last", ""]);
        // Without a match: the start.
        assert_eq!(snippet("zzz", &filler(0, 30), 3), ["w0 w1 w2…"]);
    }

    #[test]
    fn long_runs_are_cut() {
        // Each run keeps 63 characters and `…`; the space before the dashes is one of them.
        let text = format!("{} and {}", "x".repeat(200), "-".repeat(100));
        let x = format!("{}…", "x".repeat(MAX_RUN_CHARS - 1));
        let dashes = format!(" {}…", "-".repeat(MAX_RUN_CHARS - 2));
        assert_eq!(
            snippet("and", &text, 16),
            [format!("{x} "), "and".into(), dashes]
        );
        assert_eq!(snippet("x", "  ¿¡  ", 16), ["¿¡"]);
    }

    proptest! {
        #[test]
        fn pieces_alternate_and_never_exceed_their_words(
            text in "[a-zé ,.\n\u{301}\u{4e2d}]{0,200}",
            query in "[a-z é]{0,12}",
            max_words in 1usize..20,
        ) {
            let highlighter = Highlighter::new(&query);
            let pieces = highlighter.snippet(&text, max_words);
            prop_assert_eq!(pieces.len() % 2, 1);
            let mut folded = Vec::new();
            for (i, piece) in pieces.iter().enumerate() {
                if i % 2 == 1 {
                    prop_assert!(highlighter.matches(piece, &mut folded).is_some(), "{piece:?}");
                }
            }
            prop_assert!(words(&pieces.concat()).count() <= max_words, "{pieces:?}");
        }
    }
}
