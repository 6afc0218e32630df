//! Unit checks of the DFlash2 pieces that need no checkpoint: the convolution against its
//! definition written out, and the config's layer masks and refusals.

use super::config::{is_dflash2, DFlash2Config, LayerMask};
use super::conv::convolve;
use serde_json::json;

/// conv(x, base, dyn)[t, c] = Σ_o (base[o, c] + dyn[t, half, o, c / group]) · x[t − o, c], zero
/// before each block's first row: one element at a time.
#[test]
fn convolution_is_causal_inside_each_block() {
    let (rows, d, k, group, block) = (6usize, 4usize, 2usize, 2usize, 3usize);
    let g = d / group;
    let x: Vec<f32> = (0..rows * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let dynamic: Vec<f32> = (0..rows * 2 * k * g)
        .map(|i| (i as f32 * 0.11).cos())
        .collect();
    let base: Vec<f32> = (0..k * d).map(|i| 0.5 - i as f32 * 0.1).collect();
    for half in 0..2 {
        let out = convolve(&x, &dynamic, half, &base, rows, d, k, group, block).unwrap();
        for t in 0..rows {
            for c in 0..d {
                let mut want = 0f32;
                for o in 0..k {
                    if t % block >= o {
                        let dy = dynamic[((t * 2 + half) * k + o) * g + c / group];
                        want += (base[o * d + c] + dy) * x[(t - o) * d + c];
                    }
                }
                assert!(
                    (out[t * d + c] - want).abs() < 1e-6,
                    "half {half} row {t} channel {c}"
                );
            }
        }
        // A block's first row sees only itself: changing the row before it changes nothing.
        let mut moved = x.clone();
        moved[2 * d] += 5.0;
        let again = convolve(&moved, &dynamic, half, &base, rows, d, k, group, block).unwrap();
        assert_eq!(&again[3 * d..4 * d], &out[3 * d..4 * d]);
        assert_ne!(&again[2 * d..3 * d], &out[2 * d..3 * d]);
    }
    assert!(convolve(&x, &dynamic, 0, &base, rows, d, k, group, 4).is_err());
}

fn config() -> serde_json::Value {
    json!({
        "architectures": ["DFlash2DraftModel"],
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 100,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64,
        "dflash_config": {"block_size": 8, "mask_token_id": 99, "target_layer_ids": [0, 1],
            "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 16}
    })
}

fn load(v: &serde_json::Value) -> anyhow::Result<DFlash2Config> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    DFlash2Config::load(dir.path())
}

#[test]
fn layer_masks_follow_the_authors_attention() {
    let cfg = load(&config()).unwrap();
    assert_eq!(
        cfg.layer_masks,
        [
            LayerMask {
                causal_in_block: true,
                window: Some(64)
            },
            LayerMask {
                causal_in_block: false,
                window: None
            }
        ]
    );
    // The published checkpoint: sliding layers, is_causal false — bidirectional, windowed.
    let mut v = config();
    v["is_causal"] = json!(false);
    let cfg = load(&v).unwrap();
    assert_eq!(
        cfg.layer_masks[0],
        LayerMask {
            causal_in_block: false,
            window: Some(64)
        }
    );
    assert_eq!(
        (cfg.output_multiplier, cfg.final_logit_softcapping),
        (1.0, None)
    );
    v["dflash_config"]["final_logit_softcapping"] = json!(2.0);
    v["dflash_config"]["output_multiplier"] = json!(0.5);
    let cfg = load(&v).unwrap();
    assert!((cfg.transform_logit(8.0) - 2.0 * (2.0f32).tanh()).abs() < 1e-6);
}

#[test]
fn dflash2_configs_are_told_apart_and_their_keys_checked() {
    assert!(is_dflash2(&config()));
    let mut keys_only = config();
    keys_only["architectures"] = json!(["DFlashDraftModel"]);
    assert!(
        is_dflash2(&keys_only),
        "a DFlash2 key alone makes it DFlash2"
    );
    let mut plain = keys_only.clone();
    for k in [
        "conv_kernel_size",
        "conv_group_size",
        "selector_rank",
        "selector_top_k",
    ] {
        plain["dflash_config"].as_object_mut().unwrap().remove(k);
    }
    assert!(!is_dflash2(&plain));
    let mut v = config();
    v["dflash_config"]
        .as_object_mut()
        .unwrap()
        .remove("selector_rank");
    let e = format!("{:#}", load(&v).unwrap_err());
    assert!(
        e.contains("config.json") && e.contains("selector_rank"),
        "{e}"
    );
    let mut v = config();
    v["dflash_config"]["conv_group_size"] = json!(12);
    let e = format!("{:#}", load(&v).unwrap_err());
    assert!(e.contains("conv_group_size 12"), "{e}");
    let mut v = config();
    v["dflash_config"]["output_multiplier"] = json!(-1.0);
    assert!(format!("{:#}", load(&v).unwrap_err()).contains("output_multiplier"));
    let mut v = config();
    v["rope_parameters"] =
        json!({"rope_theta": 1e6, "rope_type": "default", "dimension_sections": [8, 8]});
    assert!(format!("{:#}", load(&v).unwrap_err()).contains("dimension_sections"));
}
