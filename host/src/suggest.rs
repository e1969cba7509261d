//! "Did you mean ...": the nearest of a few known names to one that is not among them.

/// The candidate nearest to `word` by edit distance, when it is near enough to be a typo
/// (at most a third of the longer word's characters differ, and at least one matches).
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d > 0 && *d <= word.chars().count().max(c.chars().count()) / 3 + 1)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_finds_typos_and_nothing_else() {
        let names = [
            "debate",
            "round-robin",
            "judge",
            "gsm8k",
            "final-only",
            "influence",
        ];
        assert_eq!(nearest("debat", names), Some("debate"));
        assert_eq!(nearest("infuence", names), Some("influence"));
        assert_eq!(nearest("final_only", names), Some("final-only"));
        assert_eq!(nearest("gsm8", names), Some("gsm8k"));
        assert_eq!(nearest("anything-else", names), None);
        assert_eq!(
            nearest("debate", names),
            None,
            "an exact name is no suggestion"
        );
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
