//! Config parsing and vocabulary-map checks of EAGLE-3 checkpoints (the numerics are checked
//! against the golden in crates/engine/tests/eagle3/main.rs).

use super::config::{Eagle3Config, TapSource, DEFAULT_STEPS};
use super::vocab::VocabMap;
use serde_json::json;

/// A SpecForge-style config (configs/qwen3-8b-eagle3.json, shrunk), with `extra` merged in.
fn config(extra: serde_json::Value) -> serde_json::Value {
    let mut c = json!({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": null,
        "vocab_size": 512,
        "draft_vocab_size": 160
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn read(extra: serde_json::Value, target_layers: usize) -> anyhow::Result<Eagle3Config> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config(extra).to_string()).unwrap();
    Eagle3Config::load(dir.path(), target_layers)
}

fn err(extra: serde_json::Value, target_layers: usize) -> String {
    format!("{:#}", read(extra, target_layers).unwrap_err())
}

#[test]
fn taps_come_from_eagle_config_as_layer_outputs() {
    let c = read(
        json!({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]}}),
        36,
    )
    .unwrap();
    assert_eq!(c.tap_layer_ids, [1, 17, 32]);
    assert_eq!(c.tap_source, TapSource::EagleConfig);
    assert_eq!(
        (c.steps, c.block_size(), c.steps_from_config),
        (DEFAULT_STEPS, DEFAULT_STEPS + 1, false)
    );
    assert_eq!(c.draft_vocab(512), 160);
    assert_eq!(c.rope_theta, 1e6);
}

/// vLLM's top-level ids name the layer whose input is captured: one less as a layer output.
#[test]
fn top_level_taps_are_read_in_vllms_convention() {
    let c = read(json!({"eagle_aux_hidden_state_layer_ids": [2, 18, 33]}), 36).unwrap();
    assert_eq!(c.tap_layer_ids, [1, 17, 32]);
    assert_eq!(c.tap_source, TapSource::VllmTopLevel);
    // eagle_config wins when both are there.
    let c = read(
        json!({"eagle_aux_hidden_state_layer_ids": [2, 18, 33], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 4, 5]}}),
        36,
    )
    .unwrap();
    assert_eq!(c.tap_layer_ids, [3, 4, 5]);
    let e = err(json!({"eagle_aux_hidden_state_layer_ids": [0, 18, 33]}), 36);
    assert!(
        e.contains("eagle_aux_hidden_state_layer_ids holds 0") && e.contains("embedding"),
        "{e}"
    );
}

/// SpecForge's `resolve_eagle_capture_layers` default, [1, L//2 − 1, L − 4].
#[test]
fn default_taps_follow_the_engines() {
    let c = read(json!({}), 36).unwrap();
    assert_eq!(c.tap_layer_ids, [1, 17, 32]);
    assert_eq!(c.tap_source, TapSource::Default);
    assert_eq!(read(json!({}), 28).unwrap().tap_layer_ids, [1, 13, 24]);
    let e = err(json!({}), 3);
    assert!(e.contains("at least 4 layers"), "{e}");
}

#[test]
fn steps_come_from_num_speculative_tokens() {
    let c = read(json!({"num_speculative_tokens": 3}), 36).unwrap();
    assert_eq!((c.steps, c.block_size(), c.steps_from_config), (3, 4, true));
    assert!(err(json!({"num_speculative_tokens": 0}), 36).contains("num_speculative_tokens 0"));
    assert!(
        err(json!({"num_speculative_tokens": 5000}), 36).contains("num_speculative_tokens 5000")
    );
}

/// Each refusal names the config file and the key.
#[test]
fn unsupported_or_bad_configs_are_refused_naming_the_key() {
    for (extra, layers, want) in [
        (
            json!({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 36]}}),
            36,
            "eagle_config.eagle_aux_hidden_state_layer_ids holds tap 36",
        ),
        (
            json!({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17]}}),
            36,
            "exactly 3 taps",
        ),
        (
            json!({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, -2, 3]}}),
            36,
            "negative layer id",
        ),
        (json!({"num_hidden_layers": 2}), 36, "num_hidden_layers 2"),
        (json!({"attention_bias": true}), 36, "attention_bias = true"),
        (json!({"fc_norm": true}), 36, "fc_norm = true"),
        (
            json!({"norm_before_residual": true}),
            36,
            "norm_before_residual = true",
        ),
        (json!({"norm_output": false}), 36, "norm_output = false"),
        (json!({"hidden_act": "gelu"}), 36, "hidden_act"),
        (
            json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}),
            36,
            "rope_scaling of type \"llama3\"",
        ),
        (
            json!({"eagle_config": {"use_aux_hidden_state": false}}),
            36,
            "use_aux_hidden_state = false",
        ),
        (
            json!({"draft_vocab_size": 600}),
            36,
            "draft_vocab_size 600 is larger than vocab_size 512",
        ),
        (
            json!({"num_key_value_heads": 3}),
            36,
            "not a multiple of num_key_value_heads 3",
        ),
        (
            json!({"speculators_model_type": "eagle3"}),
            36,
            "speculators-format",
        ),
    ] {
        let e = err(extra.clone(), layers);
        assert!(
            e.contains("config.json") && e.contains(want),
            "{extra}: {e}"
        );
    }
    // The default rope type is no scaling.
    read(json!({"rope_scaling": {"rope_type": "default"}}), 36).unwrap();
}

#[test]
fn vocabulary_maps_are_one_to_one_into_the_target() {
    // SpecForge's layout: sorted target ids, offsets id − i.
    let used = [3i64, 4, 9, 15];
    let d2t: Vec<i64> = used
        .iter()
        .enumerate()
        .map(|(i, &t)| t - i as i64)
        .collect();
    assert_eq!(
        VocabMap::from_offsets(&d2t, 16).unwrap().target_of,
        [3, 4, 9, 15]
    );
    let e = format!("{:#}", VocabMap::from_offsets(&d2t, 12).unwrap_err());
    assert!(
        e.contains(
            "d2t[3] = 12 maps draft id 3 to target id 15, outside the target's vocabulary 0..12"
        ),
        "{e}"
    );
    let e = format!("{:#}", VocabMap::from_offsets(&[1, 0, -2], 16).unwrap_err());
    assert!(
        e.contains("draft ids 0 and 1 to the same target id 1"),
        "{e}"
    );
    let e = format!("{:#}", VocabMap::from_offsets(&[0, -5], 16).unwrap_err());
    assert!(e.contains("target id -4"), "{e}");
}
