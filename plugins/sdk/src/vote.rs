//! Majority vote with the paper's tie rule.

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
    // Sorted votes counted by runs: one allocation and no tree, which matters in wasm,
    // where every `decide` votes.
    let mut invalid = 0usize;
    let mut answers: Vec<&str> = votes
        .into_iter()
        .filter_map(|vote| {
            invalid += usize::from(vote.is_none());
            vote
        })
        .collect();
    answers.sort_unstable();
    let best = answers
        .chunk_by(|a, b| a == b)
        .map(<[_]>::len)
        .max()
        .unwrap_or(0);
    if best == 0 || invalid > best {
        return Vec::new();
    }
    answers
        .chunk_by(|a, b| a == b)
        .filter(|run| run.len() == best)
        .map(|run| run[0].to_string())
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

    /// The vote as it was written with a map, the reference for the sorted one.
    fn majority_with_a_map(votes: &[Option<&str>]) -> Vec<String> {
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        let invalid = votes.iter().filter(|v| v.is_none()).count();
        for answer in votes.iter().flatten() {
            *counts.entry(answer).or_default() += 1;
        }
        let best = counts.values().copied().max().unwrap_or(0);
        if best == 0 || invalid > best {
            return Vec::new();
        }
        counts
            .into_iter()
            .filter(|(_, n)| *n == best)
            .map(|(a, _)| a.to_string())
            .collect()
    }

    #[test]
    fn the_sorted_vote_is_the_maps() {
        const ANSWERS: [Option<&str>; 6] =
            [None, Some("1"), Some("10"), Some("9"), Some("é"), Some("")];
        let mut rng = crate::testing::Xorshift::new(0xda94_2042_e4dd_58b5);
        let mut next = move |n: u64| rng.below(n) as usize;
        for _ in 0..5_000 {
            let votes: Vec<_> = (0..next(9)).map(|_| ANSWERS[next(6)]).collect();
            assert_eq!(v(&votes), majority_with_a_map(&votes), "{votes:?}");
        }
    }

    #[test]
    fn invalid_alone_on_top_or_no_votes_gives_no_answer() {
        assert!(v(&[None, None, Some("3")]).is_empty());
        assert!(v(&[None]).is_empty());
        assert!(v(&[]).is_empty());
    }
}
