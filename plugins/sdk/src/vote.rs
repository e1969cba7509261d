//! Majority vote with the paper's tie rule.

use std::collections::BTreeMap;

/// The answers with the most votes, sorted.
///
/// Every item is one vote; `None` (no valid answer) is a vote for "invalid". "Invalid" never
/// wins a tie: when it ties with real answers it is dropped and the real answers are
/// returned. When "invalid" alone has the most votes, or there are no votes, the result is
/// empty (the team has no answer).
pub fn majority<'a, I>(votes: I) -> Vec<String>
where
    I: IntoIterator<Item = Option<&'a str>>,
{
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut invalid = 0usize;
    for vote in votes {
        match vote {
            Some(answer) => *counts.entry(answer).or_default() += 1,
            None => invalid += 1,
        }
    }
    let best = counts.values().copied().max().unwrap_or(0);
    if best == 0 || invalid > best {
        return Vec::new();
    }
    counts
        .into_iter()
        .filter(|(_, n)| *n == best)
        .map(|(answer, _)| answer.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::majority;

    fn v(items: &[Option<&str>]) -> Vec<String> {
        majority(items.iter().copied())
    }

    #[test]
    fn clear_majority() {
        assert_eq!(v(&[Some("4"), Some("4"), Some("5")]), vec!["4"]);
    }

    #[test]
    fn ties_return_every_tied_answer_sorted() {
        assert_eq!(v(&[Some("9"), Some("10")]), vec!["10", "9"]);
    }

    #[test]
    fn invalid_never_wins_a_tie() {
        assert_eq!(v(&[None, Some("3")]), vec!["3"]);
        assert_eq!(v(&[None, None, Some("3"), Some("3"), Some("4")]), vec!["3"]);
        assert_eq!(v(&[None, Some("3"), Some("4")]), vec!["3", "4"]);
    }

    #[test]
    fn invalid_alone_on_top_or_no_votes_gives_no_answer() {
        assert!(v(&[None, None, Some("3")]).is_empty());
        assert!(v(&[None]).is_empty());
        assert!(v(&[]).is_empty());
    }
}
