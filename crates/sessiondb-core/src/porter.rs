//! The Porter stemmer exactly as SQLite's FTS5 `porter` tokenizer applies it, so that the words a
//! snippet highlights are the ones the embedded store's index matched.
//!
//! It works on the bytes of a folded (lower-cased, diacritic-free) UTF-8 token, as FTS5 does:
//! tokens shorter than 3 or longer than 64 bytes are left as they are, and any byte that is not
//! an ASCII vowel counts as a consonant.

/// How many bytes at its end a stem may differ in from its word: the stem begins with all but
/// these of its own bytes as the word does. A rule's suffix is never the whole word, and every
/// rule replaces a suffix by at most this many bytes that were not there (`biliti` → `ble`),
/// so a stem at least keeps its word's first byte.
pub(crate) const CHANGED_TAIL: usize = 4;

/// Replaces a token by its stem.
pub(crate) fn stem(word: &mut Vec<u8>) {
    if !(3..=64).contains(&word.len()) {
        return;
    }
    step_1a(word);
    // Step 1b: after `ed` or `ing` came off, unless `at`, `bl` or `iz` gained an `e`.
    let took_ending = matches!(apply_first(word, STEP_1B), Some(suffix) if suffix != b"eed");
    if took_ending && apply_first(word, STEP_1B2).is_none() {
        let last = word[word.len() - 1];
        let doubled = word.len() >= 2 && last == word[word.len() - 2];
        if !is_vowel(last, false) && !b"lsz".contains(&last) && doubled {
            word.pop();
        } else if measure_is_one(word) && ends_cvc(word) {
            word.push(b'e');
        }
    }
    // Step 1c.
    let last = word.len() - 1;
    if word[last] == b'y' && has_vowel(&word[..last]) {
        word[last] = b'i';
    }
    for rules in [STEP_2, STEP_3, STEP_4] {
        apply_first(word, rules);
    }
    // Step 5a.
    let stem = &word[..word.len() - 1];
    if word.ends_with(b"e") && (measure_above_one(stem) || measure_is_one(stem) && !ends_cvc(stem))
    {
        word.pop();
    }
    // Step 5b.
    if word.ends_with(b"ll") && measure_above_one(&word[..word.len() - 1]) {
        word.pop();
    }
}

#[derive(Clone, Copy)]
enum Condition {
    /// The stem holds a vowel (`*v*`).
    Vowel,
    /// m > 0.
    MeasureAboveZero,
    /// m > 1.
    MeasureAboveOne,
    /// m > 1 and the stem ends in `s` or `t`.
    MeasureAboveOneAfterSOrT,
    /// Always (the replacement of step 1b's second part).
    Always,
}

type Rule = (&'static [u8], &'static [u8], Condition);

use Condition::{Always, MeasureAboveOne, MeasureAboveOneAfterSOrT, MeasureAboveZero, Vowel};

const STEP_1B: &[Rule] = &[
    (b"eed", b"ee", MeasureAboveZero),
    (b"ed", b"", Vowel),
    (b"ing", b"", Vowel),
];
const STEP_1B2: &[Rule] = &[
    (b"at", b"ate", Always),
    (b"bl", b"ble", Always),
    (b"iz", b"ize", Always),
];
const STEP_2: &[Rule] = &[
    (b"ational", b"ate", MeasureAboveZero),
    (b"tional", b"tion", MeasureAboveZero),
    (b"enci", b"ence", MeasureAboveZero),
    (b"anci", b"ance", MeasureAboveZero),
    (b"izer", b"ize", MeasureAboveZero),
    (b"logi", b"log", MeasureAboveZero),
    (b"bli", b"ble", MeasureAboveZero),
    (b"alli", b"al", MeasureAboveZero),
    (b"entli", b"ent", MeasureAboveZero),
    (b"eli", b"e", MeasureAboveZero),
    (b"ousli", b"ous", MeasureAboveZero),
    (b"ization", b"ize", MeasureAboveZero),
    (b"ation", b"ate", MeasureAboveZero),
    (b"ator", b"ate", MeasureAboveZero),
    (b"alism", b"al", MeasureAboveZero),
    (b"iveness", b"ive", MeasureAboveZero),
    (b"fulness", b"ful", MeasureAboveZero),
    (b"ousness", b"ous", MeasureAboveZero),
    (b"aliti", b"al", MeasureAboveZero),
    (b"iviti", b"ive", MeasureAboveZero),
    (b"biliti", b"ble", MeasureAboveZero),
];
const STEP_3: &[Rule] = &[
    (b"ical", b"ic", MeasureAboveZero),
    (b"ness", b"", MeasureAboveZero),
    (b"icate", b"ic", MeasureAboveZero),
    (b"iciti", b"ic", MeasureAboveZero),
    (b"ful", b"", MeasureAboveZero),
    (b"ative", b"", MeasureAboveZero),
    (b"alize", b"al", MeasureAboveZero),
];
const STEP_4: &[Rule] = &[
    (b"al", b"", MeasureAboveOne),
    (b"ance", b"", MeasureAboveOne),
    (b"ence", b"", MeasureAboveOne),
    (b"er", b"", MeasureAboveOne),
    (b"ic", b"", MeasureAboveOne),
    (b"able", b"", MeasureAboveOne),
    (b"ible", b"", MeasureAboveOne),
    (b"ant", b"", MeasureAboveOne),
    (b"ement", b"", MeasureAboveOne),
    (b"ment", b"", MeasureAboveOne),
    (b"ent", b"", MeasureAboveOne),
    (b"ion", b"", MeasureAboveOneAfterSOrT),
    (b"ou", b"", MeasureAboveOne),
    (b"ism", b"", MeasureAboveOne),
    (b"ate", b"", MeasureAboveOne),
    (b"iti", b"", MeasureAboveOne),
    (b"ous", b"", MeasureAboveOne),
    (b"ive", b"", MeasureAboveOne),
    (b"ize", b"", MeasureAboveOne),
];

/// Finds the first rule whose suffix ends `word` (and is shorter than it) and, when its condition
/// holds on the stem before the suffix, replaces the suffix. Later rules are not tried once one
/// suffix matched: FTS5 groups them by the word's second-last byte, and within a group tries
/// them in this order. The suffix replaced, if one was.
fn apply_first(word: &mut Vec<u8>, rules: &[Rule]) -> Option<&'static [u8]> {
    let &(suffix, replacement, condition) = rules
        .iter()
        .find(|(suffix, ..)| word.len() > suffix.len() && word.ends_with(suffix))?;
    let stem = word.len() - suffix.len();
    let holds = match condition {
        Vowel => has_vowel(&word[..stem]),
        MeasureAboveZero => measure_above_zero(&word[..stem]),
        MeasureAboveOne => measure_above_one(&word[..stem]),
        MeasureAboveOneAfterSOrT => {
            matches!(word[stem - 1], b's' | b't') && measure_above_one(&word[..stem])
        }
        Always => true,
    };
    if !holds {
        return None;
    }
    word.truncate(stem);
    word.extend_from_slice(replacement);
    Some(suffix)
}

fn step_1a(word: &mut Vec<u8>) {
    let n = word.len();
    if word[n - 1] != b's' {
        return;
    }
    if word[n - 2] == b'e' {
        let sses = n > 4 && word[n - 4] == b's' && word[n - 3] == b's';
        let ies = n > 3 && word[n - 3] == b'i';
        word.truncate(if sses || ies { n - 2 } else { n - 1 });
    } else if word[n - 2] != b's' {
        word.truncate(n - 1);
    }
}

/// `y` is a vowel after a consonant.
fn is_vowel(byte: u8, after_consonant: bool) -> bool {
    matches!(byte, b'a' | b'e' | b'i' | b'o' | b'u') || after_consonant && byte == b'y'
}

/// Past the stem's first vowel-consonant sequence (given whether the byte before the stem was a
/// consonant): the length up to and including that consonant, or None when there is none.
fn vowel_then_consonant(stem: &[u8], after_consonant: bool) -> Option<usize> {
    let mut consonant = after_consonant;
    let mut i = 0;
    while i < stem.len() {
        consonant = !is_vowel(stem[i], consonant);
        i += 1;
        if !consonant {
            break;
        }
    }
    if consonant {
        return None;
    }
    while i < stem.len() {
        consonant = !is_vowel(stem[i], consonant);
        i += 1;
        if consonant {
            return Some(i);
        }
    }
    None
}

fn measure_above_zero(stem: &[u8]) -> bool {
    vowel_then_consonant(stem, false).is_some()
}

fn measure_above_one(stem: &[u8]) -> bool {
    vowel_then_consonant(stem, false)
        .is_some_and(|n| vowel_then_consonant(&stem[n..], true).is_some())
}

fn measure_is_one(stem: &[u8]) -> bool {
    vowel_then_consonant(stem, false)
        .is_some_and(|n| vowel_then_consonant(&stem[n..], true).is_none())
}

/// `*v*`: FTS5 counts `y` as a vowel anywhere but first.
fn has_vowel(stem: &[u8]) -> bool {
    stem.iter().enumerate().any(|(i, &b)| is_vowel(b, i > 0))
}

/// `*o`: consonant, vowel, consonant at the end, the last not `w`, `x` or `y`.
fn ends_cvc(stem: &[u8]) -> bool {
    if matches!(stem.last(), None | Some(b'w' | b'x' | b'y')) {
        return false;
    }
    let mut consonant = false;
    let mut pattern = 0u8;
    for &byte in stem {
        consonant = !is_vowel(byte, consonant);
        pattern = ((pattern << 1) | u8::from(consonant)) & 0b111;
    }
    pattern == 0b101
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stemmed(word: &str) -> String {
        let mut word = word.as_bytes().to_vec();
        stem(&mut word);
        String::from_utf8(word).unwrap()
    }

    /// The examples of Porter's paper ("An algorithm for suffix stripping", 1980), step by step.
    #[test]
    fn stems_the_papers_examples() {
        for (word, expected) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "ti"),
            ("caress", "caress"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("bled", "bled"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("troubled", "troubl"),
            ("sized", "size"),
            ("hopping", "hop"),
            ("tanned", "tan"),
            ("falling", "fall"),
            ("hissing", "hiss"),
            ("fizzed", "fizz"),
            ("failing", "fail"),
            ("filing", "file"),
            ("happy", "happi"),
            ("sky", "sky"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("rational", "ration"),
            ("valenci", "valenc"),
            ("hesitanci", "hesit"),
            ("digitizer", "digit"),
            ("conformabli", "conform"),
            ("radicalli", "radic"),
            ("differentli", "differ"),
            ("vileli", "vile"),
            ("analogousli", "analog"),
            ("vietnamization", "vietnam"),
            ("predication", "predic"),
            ("operator", "oper"),
            ("feudalism", "feudal"),
            ("decisiveness", "decis"),
            ("hopefulness", "hope"),
            ("callousness", "callous"),
            ("formaliti", "formal"),
            ("sensitiviti", "sensit"),
            ("sensibiliti", "sensibl"),
            ("triplicate", "triplic"),
            ("formative", "form"),
            ("formalize", "formal"),
            ("electriciti", "electr"),
            ("electrical", "electr"),
            ("hopeful", "hope"),
            ("goodness", "good"),
            ("revival", "reviv"),
            ("allowance", "allow"),
            ("inference", "infer"),
            ("airliner", "airlin"),
            ("gyroscopic", "gyroscop"),
            ("adjustable", "adjust"),
            ("defensible", "defens"),
            ("irritant", "irrit"),
            ("replacement", "replac"),
            ("adjustment", "adjust"),
            ("dependent", "depend"),
            ("adoption", "adopt"),
            ("homologou", "homolog"),
            ("communism", "commun"),
            ("activate", "activ"),
            ("angulariti", "angular"),
            ("homologous", "homolog"),
            ("effective", "effect"),
            ("bowdlerize", "bowdler"),
            ("probate", "probat"),
            ("rate", "rate"),
            ("cease", "ceas"),
            ("controll", "control"),
            ("roll", "roll"),
            ("generalizations", "gener"),
            ("oscillators", "oscil"),
        ] {
            assert_eq!(stemmed(word), expected, "{word}");
        }
    }

    #[test]
    fn leaves_short_and_long_tokens_and_keeps_the_first_byte() {
        assert_eq!(stemmed("is"), "is");
        assert_eq!(stemmed(&"s".repeat(65)), "s".repeat(65));
        assert_eq!(stemmed("eed"), "e");
        assert_eq!(stemmed("aed"), "a");
        assert_eq!(stemmed("caf\u{e9}s"), "caf\u{e9}");
    }

    proptest! {
        #[test]
        fn a_stem_differs_from_its_word_only_in_its_last_bytes(
            word in "[a-z]{0,8}(ation|ational|ization|biliti|iviti|enci|ousli|ing|ed|ies|sses|y|e|ll|s)?(s|ed|ing|y|e|ly|ness)?",
        ) {
            let stem = stemmed(&word);
            let kept = stem.len().saturating_sub(CHANGED_TAIL).max(1).min(word.len());
            prop_assert_eq!(&stem.as_bytes()[..kept], &word.as_bytes()[..kept], "{} → {}", word, stem);
        }
    }
}
