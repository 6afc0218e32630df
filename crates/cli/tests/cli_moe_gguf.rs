//! `inspect` on the mixture-of-experts GGUF files llama.cpp's converter wrote from the MoE goldens
//! (tests/fixtures/golden/moe_gguf/, tools/golden/make_moe_gguf.py): the same experts, active
//! parameters, parameter count and layer mix as the Hugging Face checkpoint they came from.

mod cli_util;

use cli_util::*;

#[test]
fn inspect_shows_the_gguf_experts_as_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let golden = root().join("tests/fixtures/golden");
    for (file, folder, layers, line) in [
        (
            "qwen3_moe-bf16.gguf",
            "qwen3_moe",
            serde_json::json!([0, 2]),
            "  experts       16 per layer on layers [0,2], 8 active per token",
        ),
        (
            "qwen3_5_moe-bf16.gguf",
            "qwen3_5_moe",
            serde_json::json!([0, 1, 2]),
            "  experts       16 per layer on layers [0-2], 8 active per token",
        ),
    ] {
        let gguf = golden.join("moe_gguf").join(file);
        let g = json_out(&dl(&cache, &["--json", "inspect", s(&gguf)]), file);
        let h = json_out(
            &dl(&cache, &["--json", "inspect", s(&golden.join(folder))]),
            folder,
        );
        assert_eq!(g["format"], "gguf", "{g}");
        assert_eq!(g["experts"]["layers"], layers, "{file}");
        for key in ["experts", "parameters", "layer_mix", "spec"] {
            assert_eq!(g[key], h[key], "{file}: {key} differs from {folder}'s");
        }
        let o = dl(&cache, &["inspect", s(&gguf)]);
        ok(&o, file);
        assert!(stdout(&o).contains(line), "{}", stdout(&o));
    }
}
