//! Any byte string opens as a GGUF file or fails with a typed error; what opens can be used.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer::gguf::GgufFile;
use minfer::models::HParams;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    for (_, v) in f.metadata() {
        let _ = v.to_json(8);
    }
    for t in f.tensors() {
        let bytes = f.tensor_data(t).expect("validated tensor is in bounds");
        assert_eq!(bytes.len() as u64, t.n_bytes);
        let _ = t.weight_type();
    }
    let _ = HParams::from_gguf(&f);
});
