//! The replay chain (`docs/metrics.md` §2–§3): the anchors a greedy speculative decode visits,
//! a₀ = the first completion anchor, a_{i+1} = a_i + A(a_i) + 1, and the tokens each verify round
//! yields: A + 1 (the accepted drafts and the bonus token), but never a token past the end of the
//! sequence, so a round whose drafts reach the last position yields A.
//!
//! The native metrics, the web UI and the `replayed-tau` plugin all call [`replay`]; the drafter
//! evaluation walks the same chain with [`next_anchor`] to know which anchors to draft.

/// What is known about the end of the sequence a chain runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceEnd {
    /// The last position of the sequence (prompt + continuation, T − 1).
    At(u32),
    /// Unknown (a plugin sees records only, and no block was cut by the end): the chain stops
    /// when it passes the last stored anchor, and every round counts A + 1.
    Unknown { last_anchor: u32 },
}

/// One verify round of a replayed decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    pub anchor: u32,
    /// A: drafts accepted in this round.
    pub accepted: u32,
    /// Tokens the round yields: A + 1, or fewer at the end of the sequence.
    pub tokens: u32,
}

/// The chain needs a block at this anchor and none was stored (anchors were subsampled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissingAnchor(pub u32);

/// The anchor after a round at `anchor` that accepted `accepted` drafts.
pub fn next_anchor(anchor: u32, accepted: u32) -> u32 {
    anchor + accepted + 1
}

/// Tokens a round at `anchor` with accepted length `accepted` yields: A + 1, capped by the
/// positions left after the anchor when the sequence end is known (no bonus past the end).
pub fn round_tokens(anchor: u32, accepted: u32, end: SequenceEnd) -> u32 {
    match end {
        SequenceEnd::At(e) => (accepted + 1).min(e.saturating_sub(anchor)),
        SequenceEnd::Unknown { .. } => accepted + 1,
    }
}

/// Replay the chain from `first` (the first completion anchor). `accepted_at(a)` is A of the
/// stored block at anchor a, or None when there is none. The chain stops when the anchor reaches
/// the end (nothing left to verify); a missing block before that is an error.
pub fn replay(
    first: u32,
    end: SequenceEnd,
    mut accepted_at: impl FnMut(u32) -> Option<u32>,
) -> Result<Vec<Round>, MissingAnchor> {
    let mut rounds = Vec::new();
    let mut a = first;
    loop {
        match end {
            SequenceEnd::At(e) if a >= e => return Ok(rounds),
            SequenceEnd::Unknown { last_anchor } if a > last_anchor => return Ok(rounds),
            _ => {}
        }
        let accepted = accepted_at(a).ok_or(MissingAnchor(a))?;
        rounds.push(Round {
            anchor: a,
            accepted,
            tokens: round_tokens(a, accepted, end),
        });
        a = next_anchor(a, accepted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(a: &[(u32, u32)]) -> impl Fn(u32) -> Option<u32> + '_ {
        move |x| a.iter().find(|(k, _)| *k == x).map(|(_, v)| *v)
    }

    #[test]
    fn chain_by_hand_with_a_cut_last_round() {
        // Sequence positions 0..=12 (end 12), prompt 0..5. A: 5 → 3, 9 → 3 (10, 11, 12 accepted).
        let acc = [(5, 3), (6, 0), (7, 0), (8, 0), (9, 3), (10, 2), (11, 1)];
        let r = replay(5, SequenceEnd::At(12), table(&acc)).unwrap();
        let got: Vec<(u32, u32, u32)> =
            r.iter().map(|r| (r.anchor, r.accepted, r.tokens)).collect();
        // Round 9 accepted every remaining position: 3 tokens, no bonus past 12.
        assert_eq!(got, [(5, 3, 4), (9, 3, 3)]);
        // Unknown end: the same chain counts A + 1 and stops after the last stored anchor (11).
        let r = replay(5, SequenceEnd::Unknown { last_anchor: 11 }, table(&acc)).unwrap();
        assert_eq!(r.iter().map(|r| r.tokens).sum::<u32>(), 8);
    }

    #[test]
    fn a_missing_anchor_inside_the_sequence_is_reported() {
        let acc = [(0, 0), (1, 0), (3, 0)];
        assert_eq!(
            replay(0, SequenceEnd::At(5), table(&acc)),
            Err(MissingAnchor(2))
        );
        assert_eq!(
            replay(0, SequenceEnd::Unknown { last_anchor: 3 }, table(&acc)),
            Err(MissingAnchor(2))
        );
        // A chain starting at the end has no round.
        assert_eq!(replay(5, SequenceEnd::At(5), table(&acc)), Ok(vec![]));
    }
}
