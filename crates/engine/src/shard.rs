//! The shard rule (`draftlens_results::shard`, docs/scale-out.md §1) applied to the engine's
//! prompts: a prompt belongs to shard `I/N` by the hash of what the model sees ([`Prompt::hash`]).

use crate::prompts::Prompt;
use draftlens_results::shard::Shard;

/// Indices (into `prompts`) of the prompts of `shard`, ascending.
pub fn prompts_of_shard(shard: &Shard, prompts: &[Prompt]) -> Vec<usize> {
    (0..prompts.len())
        .filter(|&i| shard.owns_hash(&prompts[i].hash()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(text: &str) -> Prompt {
        Prompt {
            id: String::new(),
            text: Some(text.into()),
            messages: None,
            category: None,
            language: None,
            completion: None,
            enable_thinking: None,
        }
    }

    /// The prompt "a" hashes as sha256 of {"prompt":"a","messages":null}, and its shard is read
    /// from that hash by the rule.
    #[test]
    fn known_answer() {
        let p = prompt("a");
        let want = crate::util::sha256_bytes(br#"{"prompt":"a","messages":null}"#);
        assert_eq!(p.hash(), want);
        let v = u64::from_str_radix(&want[..16], 16).unwrap();
        let shard = Shard::new((v % 3) as u32, 3).unwrap();
        assert_eq!(prompts_of_shard(&shard, &[p]), vec![0]);
    }

    /// N shards partition a set, whatever its order.
    #[test]
    fn partition_stable_under_reordering() {
        let ps: Vec<Prompt> = (0..200).map(|i| prompt(&format!("prompt {i}"))).collect();
        let mut rev = ps.clone();
        rev.reverse();
        for n in [1u32, 2, 3, 7] {
            let mut seen = vec![0u32; ps.len()];
            for i in 0..n {
                let sh = Shard::new(i, n).unwrap();
                for j in prompts_of_shard(&sh, &ps) {
                    seen[j] += 1;
                }
                let a: Vec<String> = prompts_of_shard(&sh, &ps)
                    .iter()
                    .map(|&j| ps[j].hash())
                    .collect();
                let mut b: Vec<String> = prompts_of_shard(&sh, &rev)
                    .iter()
                    .map(|&j| rev[j].hash())
                    .collect();
                b.reverse();
                assert_eq!(a, b, "shard {sh} differs when the file is reversed");
            }
            assert!(seen.iter().all(|&c| c == 1), "{n} shards do not partition");
        }
    }
}
