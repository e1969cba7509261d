//! How good a verifier's probabilities are: ROC AUC (ranking) and expected calibration
//! error (ECE, whether 0.7 means right 70% of the time).

use serde::{Deserialize, Serialize};

/// Validation metrics of a verifier over labelled answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    pub answers: usize,
    /// Share of right answers.
    pub positives: f64,
    /// ROC AUC; `None` when only one class is present.
    pub auc: Option<f64>,
    /// Expected calibration error over 10 equal-width bins.
    pub ece: f64,
    /// Mean BCE of the last-token probability.
    pub loss: f64,
    /// Accuracy of thresholding at 0.5.
    pub accuracy: f64,
}

impl Validation {
    pub fn of(probs: &[f32], labels: &[bool]) -> Validation {
        assert_eq!(probs.len(), labels.len());
        let n = probs.len().max(1) as f64;
        let loss = probs
            .iter()
            .zip(labels)
            .map(|(&p, &y)| {
                let p = f64::from(p).clamp(1e-7, 1.0 - 1e-7);
                if y {
                    -p.ln()
                } else {
                    -(1.0 - p).ln()
                }
            })
            .sum::<f64>()
            / n;
        let accuracy = probs
            .iter()
            .zip(labels)
            .filter(|(&p, &y)| (p >= 0.5) == y)
            .count() as f64
            / n;
        Validation {
            answers: probs.len(),
            positives: labels.iter().filter(|&&y| y).count() as f64 / n,
            auc: auc(probs, labels),
            ece: ece(probs, labels, 10),
            loss,
            accuracy,
        }
    }
}

/// ROC AUC: the probability that a random right answer scores above a random wrong one
/// (ties count half). `None` without both classes.
pub fn auc(probs: &[f32], labels: &[bool]) -> Option<f64> {
    let pos = labels.iter().filter(|&&y| y).count();
    let neg = labels.len() - pos;
    if pos == 0 || neg == 0 {
        return None;
    }
    // Mann-Whitney U from average ranks.
    let mut idx: Vec<usize> = (0..probs.len()).collect();
    idx.sort_by(|&a, &b| probs[a].total_cmp(&probs[b]));
    let mut rank_sum_pos = 0.0;
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && probs[idx[j + 1]] == probs[idx[i]] {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            if labels[k] {
                rank_sum_pos += avg_rank;
            }
        }
        i = j + 1;
    }
    let (p, n) = (pos as f64, neg as f64);
    Some((rank_sum_pos - p * (p + 1.0) / 2.0) / (p * n))
}

/// Expected calibration error: the answer-weighted mean |accuracy - confidence| over `bins`
/// equal-width bins of the predicted probability.
pub fn ece(probs: &[f32], labels: &[bool], bins: usize) -> f64 {
    if probs.is_empty() {
        return 0.0;
    }
    let mut count = vec![0usize; bins];
    let mut conf = vec![0f64; bins];
    let mut hits = vec![0f64; bins];
    for (&p, &y) in probs.iter().zip(labels) {
        let b = ((f64::from(p) * bins as f64) as usize).min(bins - 1);
        count[b] += 1;
        conf[b] += f64::from(p);
        hits[b] += f64::from(u8::from(y));
    }
    let n = probs.len() as f64;
    (0..bins)
        .filter(|&b| count[b] > 0)
        .map(|b| (hits[b] - conf[b]).abs() / n)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_of_known_rankings() {
        let labels = [true, true, false, false];
        assert_eq!(auc(&[0.9, 0.8, 0.2, 0.1], &labels), Some(1.0));
        assert_eq!(auc(&[0.1, 0.2, 0.8, 0.9], &labels), Some(0.0));
        // One of four (pos, neg) pairs inverted.
        assert_eq!(auc(&[0.9, 0.3, 0.4, 0.1], &labels), Some(0.75));
        // All tied: chance.
        assert_eq!(auc(&[0.5; 4], &labels), Some(0.5));
        assert_eq!(auc(&[0.5, 0.4], &[true, true]), None);
    }

    #[test]
    fn ece_of_known_calibrations() {
        // Perfect: everything said 0.75 and 3 of 4 right.
        let e = ece(&[0.75; 4], &[true, true, true, false], 10);
        assert!(e.abs() < 1e-9, "{e}");
        // Confidently wrong: said 0.95, all wrong.
        let e = ece(&[0.95; 2], &[false, false], 10);
        assert!((e - 0.95).abs() < 1e-6, "{e}");
    }
}
