//! `EngineParams::dump` (`MINFER_DUMP_DIR` + `MINFER_DUMP_POS`): the position's node outputs are
//! written as raw f32 rows, in a prefill as in a decode step, and the dump changes nothing.

mod common;

use std::path::Path;
use std::sync::Arc;

use minfer::generate::{Engine, EngineParams, NodeDump};
use minfer::gguf::GgufFile;
use minfer::models::load_model;

fn engine(dump: Option<NodeDump>) -> Engine {
    let f = GgufFile::open(common::model_path(common::QWEN3_TINY)).expect("model opens");
    let m = load_model(Arc::new(f)).expect("model loads");
    let p = EngineParams { n_seq: 1, n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx: 64, n_threads: 2, backends: None, trace: false, dump, kv_type: Default::default() };
    Engine::new(Arc::new(m), &p).expect("engine")
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn dump_writes_the_positions_rows_and_changes_nothing() {
    let ids = [785u32, 6722, 315, 9625, 374];
    let base = std::env::temp_dir().join(format!("minfer-dump-test-{}", std::process::id()));
    let plain = {
        let mut e = engine(None);
        e.prefill(&ids[..3], None).unwrap();
        e.eval(&ids[3..4], 1).unwrap();
        e.eval(&ids[4..5], 1).unwrap()
    };
    // Position 1 falls inside the prefill (3 tokens), position 4 in a decode step.
    for pos in [1usize, 4] {
        let dir = base.join(pos.to_string());
        let mut e = engine(Some(NodeDump { dir: dir.clone(), pos }));
        e.prefill(&ids[..3], None).unwrap();
        e.eval(&ids[3..4], 1).unwrap();
        let last = e.eval(&ids[4..5], 1).unwrap();
        assert_eq!(last, plain, "dumping must not change the logits");
        let index = std::fs::read_to_string(dir.join("index.tsv")).unwrap();
        for name in ["token_embd", "attn_norm-0", "attn_k-0", "ffn_inp-1", "l_out-2"] {
            assert!(index.lines().any(|l| l.split('\t').next() == Some(name)), "{name} not in the index");
            assert_eq!(read_f32(&dir.join(format!("{name}.f32"))).len(), 256, "{name}: one row of n_embd");
        }
        // The last layer's tail and the head compute only the output rows: dumped only when
        // `pos` is one of them.
        let logits = dir.join("result_output.f32");
        match pos {
            4 => assert_eq!(read_f32(&logits), last),
            _ => assert!(!logits.exists() && !dir.join("l_out-3.f32").exists(), "no row of pos {pos} there"),
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}
