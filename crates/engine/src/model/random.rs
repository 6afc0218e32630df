//! Random target weights of any shape, served through [`WeightSource`] so that the real model code
//! (`TargetModel::load` and its forward) can be benchmarked at shapes no checkpoint here has
//! (e.g. Qwen3-8B). Speed does not depend on the values; they only have to be finite, non-zero and
//! of a realistic scale so that norms and softmax see ordinary numbers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use rayon::prelude::*;

use super::config::{HybridSpec, LayerType};
use super::moe::{ffn_tensors, is_ffn_tensor};
use super::{Arch, ModelSpec};
use crate::formats::{HostTensor, TensorInfo, WeightSource};

/// Qwen3-8B's shapes (36 layers, D 4096, 32/8 heads of 128, I 12 288, vocab 151 936).
pub fn qwen3_8b_spec() -> ModelSpec {
    ModelSpec {
        arch: Arch::Qwen3,
        vocab_size: 151_936,
        hidden_size: 4096,
        intermediate_size: 12_288,
        num_layers: 36,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        rope_theta: 1e6,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        max_position_embeddings: 40_960,
        attention_bias: false,
        qk_norm: true,
        bos_token_id: None,
        eos_token_ids: vec![],
        hybrid: None,
        moe: None,
        gpt_oss: None,
    }
}

/// Qwen3.5-27B's text shapes (64 layers, every 4th full attention; D 5120, 24/4 heads of 256 with
/// a quarter rotary; GDN 16 key / 48 value heads of 128, conv kernel 4; I 17 408; vocab 248 320).
pub fn qwen3_5_27b_spec() -> ModelSpec {
    let layers = 64;
    ModelSpec {
        arch: Arch::Qwen3_5,
        vocab_size: 248_320,
        hidden_size: 5120,
        intermediate_size: 17_408,
        num_layers: layers,
        num_heads: 24,
        num_kv_heads: 4,
        head_dim: 256,
        rope_theta: 1e7,
        max_position_embeddings: 262_144,
        hybrid: Some(HybridSpec {
            layer_types: (0..layers)
                .map(|i| {
                    if (i + 1) % 4 == 0 {
                        LayerType::FullAttention
                    } else {
                        LayerType::LinearAttention
                    }
                })
                .collect(),
            linear_num_key_heads: 16,
            linear_num_value_heads: 48,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            linear_conv_kernel_dim: 4,
            rotary_dim: 64,
        }),
        ..qwen3_8b_spec()
    }
}

/// Every tensor a [`ModelSpec`] implies, generated on request from (seed, name).
pub struct RandomWeights {
    path: PathBuf,
    shapes: HashMap<String, Vec<usize>>,
    seed: u64,
    /// Matrices are uniform in `±matrix_half_width` (0.0346 by default: std 0.02, like an init).
    matrix_half_width: f32,
    /// Vectors (norm weights) are uniform in `1 ± norm_spread` (0.1 by default).
    norm_spread: f32,
    /// Round every value to bf16, so a bf16 backend holds exactly the f32 backend's weights.
    bf16_exact: bool,
}

impl RandomWeights {
    pub fn new(spec: &ModelSpec, seed: u64) -> RandomWeights {
        let (d, hd) = (spec.hidden_size, spec.head_dim);
        let (qd, kvd) = (spec.num_heads * hd, spec.num_kv_heads * hd);
        let mut shapes = HashMap::new();
        shapes.insert(
            "model.embed_tokens.weight".to_string(),
            vec![spec.vocab_size, d],
        );
        shapes.insert("model.norm.weight".to_string(), vec![d]);
        if !spec.tie_word_embeddings {
            shapes.insert("lm_head.weight".to_string(), vec![spec.vocab_size, d]);
        }
        for l in 0..spec.num_layers {
            // Dense SwiGLU, or a sparse layer's router, experts and shared expert.
            shapes.extend(ffn_tensors(spec, l));
            if let Some(hy) = &spec.hybrid {
                shapes.extend(
                    hy.layer_tensors(spec, l)
                        .into_iter()
                        .filter(|(n, _)| !is_ffn_tensor(n)),
                );
                continue;
            }
            let p = format!("model.layers.{l}");
            let mut put = |n: &str, s: Vec<usize>| shapes.insert(format!("{p}.{n}"), s);
            put("input_layernorm.weight", vec![d]);
            put("post_attention_layernorm.weight", vec![d]);
            put("self_attn.q_proj.weight", vec![qd, d]);
            put("self_attn.k_proj.weight", vec![kvd, d]);
            put("self_attn.v_proj.weight", vec![kvd, d]);
            put("self_attn.o_proj.weight", vec![d, qd]);
            if spec.attention_bias {
                put("self_attn.q_proj.bias", vec![qd]);
                put("self_attn.k_proj.bias", vec![kvd]);
                put("self_attn.v_proj.bias", vec![kvd]);
            }
            if spec.qk_norm {
                put("self_attn.q_norm.weight", vec![hd]);
                put("self_attn.k_norm.weight", vec![hd]);
            }
            if spec.gpt_oss.is_some() {
                // Sinks and the q/k/v/o biases (q/k/v again: the same shapes).
                shapes.extend(super::gpt_oss::attention_extra_tensors(spec, l));
            }
        }
        RandomWeights {
            path: PathBuf::from(format!("<random weights, seed {seed}>")),
            shapes,
            seed,
            matrix_half_width: 0.0346,
            norm_spread: 0.1,
            bf16_exact: false,
        }
    }

    /// Other value ranges: backend parity wants larger weights and norms far from 1 so that
    /// every layer's dynamics (and its rounding) are exercised, not a near-identity network.
    pub fn with_init(mut self, matrix_std: f32, norm_spread: f32) -> Self {
        self.matrix_half_width = matrix_std * 3f32.sqrt();
        self.norm_spread = norm_spread;
        self
    }

    /// Values rounded to bf16 (see [`RandomWeights::bf16_exact`]'s field doc).
    pub fn bf16_exact(mut self) -> Self {
        self.bf16_exact = true;
        self
    }
}

/// splitmix64: a tiny, well-mixed generator; one stream per 4096-value chunk so that generation
/// runs in parallel and the values do not depend on the thread count.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl WeightSource for RandomWeights {
    fn path(&self) -> &Path {
        &self.path
    }
    fn contains(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        let mut infos: Vec<TensorInfo> = self
            .shapes
            .iter()
            .map(|(name, shape)| TensorInfo {
                name: name.clone(),
                file_name: name.clone(),
                dtype: "F32".into(),
                shape: shape.clone(),
                bytes: 4 * shape.iter().product::<usize>() as u64,
            })
            .collect();
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        infos
    }
    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let Some(shape) = self.shapes.get(name) else {
            bail!("{}: no tensor {name}", self.path.display());
        };
        let n: usize = shape.iter().product();
        // Vectors are norm weights (≈ 1); matrices are uniform around 0.
        let (center, half_width) = if shape.len() == 1 {
            (1.0f32, self.norm_spread)
        } else {
            (0.0, self.matrix_half_width)
        };
        let bf16_exact = self.bf16_exact;
        let base = self.seed ^ name_hash(name);
        let mut data = vec![0f32; n];
        data.par_chunks_mut(4096)
            .enumerate()
            .for_each(|(c, chunk)| {
                let mut s = splitmix(base ^ (c as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
                for v in chunk.iter_mut() {
                    s = splitmix(s);
                    let u = (s >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                    *v = center + half_width * (2.0 * u - 1.0);
                    if bf16_exact {
                        *v = half::bf16::from_f32(*v).to_f32();
                    }
                }
            });
        Ok(HostTensor {
            shape: shape.clone(),
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{cpu::CpuBackend, Backend};
    use crate::model::{Capture, TargetModel};

    /// Qwen3's architecture (q/k norm, untied head) at a size the tests run in microseconds.
    fn tiny_spec() -> ModelSpec {
        ModelSpec {
            vocab_size: 64,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            max_position_embeddings: 128,
            ..qwen3_8b_spec()
        }
    }

    #[test]
    fn a_small_random_model_loads_and_runs_through_the_real_model_code() {
        let spec = tiny_spec();
        let src = RandomWeights::new(&spec, 7);
        let a = src.tensor("model.layers.1.mlp.up_proj.weight").unwrap();
        assert_eq!(a.shape, vec![48, 32]);
        assert!(a
            .data
            .iter()
            .all(|v| v.is_finite() && *v != 0.0 && v.abs() < 0.035));
        // Same (seed, name) gives the same values; another name gives others.
        assert_eq!(
            a.data,
            src.tensor("model.layers.1.mlp.up_proj.weight")
                .unwrap()
                .data
        );
        assert_ne!(
            a.data,
            src.tensor("model.layers.0.mlp.up_proj.weight")
                .unwrap()
                .data
        );
        let err = src
            .tensor("model.layers.9.mlp.up_proj.weight")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no tensor model.layers.9.mlp.up_proj.weight"),
            "{err}"
        );

        let be = CpuBackend::new();
        let model = TargetModel::load(&be, &spec, &src).unwrap();
        let mut cache = model.new_cache();
        let out = model
            .forward(&be, &[1, 2, 3, 4, 5], &mut cache, &Capture::default())
            .unwrap();
        let h = be.to_host(&out.last_hidden).unwrap();
        assert_eq!(h.len(), 5 * 32);
        assert!(h.iter().all(|v| v.is_finite()));
    }

    /// Serves `inner` but with one tensor of the wrong shape.
    struct OneBadShape {
        inner: RandomWeights,
        bad: &'static str,
    }
    impl WeightSource for OneBadShape {
        fn path(&self) -> &Path {
            self.inner.path()
        }
        fn contains(&self, name: &str) -> bool {
            self.inner.contains(name)
        }
        fn tensors(&self) -> Vec<TensorInfo> {
            Vec::new()
        }
        fn tensor(&self, name: &str) -> Result<HostTensor> {
            let mut t = self.inner.tensor(name)?;
            if name == self.bad {
                t.shape[0] -= 1;
                t.data.truncate(t.shape.iter().product());
            }
            Ok(t)
        }
    }

    #[test]
    fn a_wrong_shape_inside_a_fused_projection_names_that_tensor() {
        let spec = tiny_spec();
        // q/k/v are stacked into one matrix and gate/up into another at load; the error must
        // still name the HF tensor that is wrong, not the fused one.
        for bad in [
            "model.layers.1.self_attn.k_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
        ] {
            let src = OneBadShape {
                inner: RandomWeights::new(&spec, 3),
                bad,
            };
            let err = match TargetModel::load(&CpuBackend::new(), &spec, &src) {
                Ok(_) => panic!("{bad}: a wrong shape was accepted"),
                Err(e) => format!("{e:#}"),
            };
            assert!(err.contains(bad) && err.contains("shape"), "{bad}: {err}");
        }
    }
}
