//! `minfer info MODEL [--json] [--tensors]`.

use std::path::Path;

use serde_json::json;

use super::{CliError, Out};
use crate::gguf::GgufFile;
use crate::models::HParams;

/// Arrays longer than this are cut in `--json` metadata.
const JSON_ARRAY_ITEMS: usize = 16;

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// What loading on the `--backend` list gave: per backend, (name, device, weight bytes held,
/// buffer bytes reserved), and the seconds the engine took to be ready.
struct Loaded {
    backends: Vec<(String, String, usize, usize)>,
    seconds: f64,
}

fn load_on(file: std::sync::Arc<GgufFile>, backends: &str) -> Result<Loaded, CliError> {
    let t0 = std::time::Instant::now();
    let model = std::sync::Arc::new(crate::models::load_model(file)?);
    let n_ctx = (model.hparams().n_ctx_train as usize).clamp(1, 4096);
    let p = crate::generate::EngineParams { n_ctx, backends: Some(backends.to_string()), ..Default::default() };
    let engine = crate::generate::Engine::new(model, &p)?;
    let seconds = t0.elapsed().as_secs_f64();
    let registry = crate::backends::registry();
    let backends = engine
        .backends()
        .into_iter()
        .map(|b| {
            let entry = registry.entry(b);
            let name = entry.map_or_else(|| b.to_string(), |e| e.name.to_string());
            let device = entry.and_then(|e| e.probed.as_ref().ok()).map_or_else(|| "-".to_string(), |d| d.name.clone());
            let m = engine.memory(b).unwrap_or_default();
            (name, device, m.weight_bytes, m.bytes_in_use)
        })
        .collect();
    Ok(Loaded { backends, seconds })
}

pub fn run(out: &mut Out, path: &Path, json: bool, tensors: bool, backend: Option<&str>) -> Result<(), CliError> {
    let f = std::sync::Arc::new(GgufFile::open(path)?);
    let loaded = backend.map(|b| load_on(f.clone(), b)).transpose()?;
    let hp = HParams::from_gguf(&f);
    let mix = f.type_mix();
    let n_params = f.n_params();
    if json {
        let mut v = json!({
            "path": path.display().to_string(),
            "file_size": f.file_size(),
            "gguf_version": f.version(),
            "alignment": f.alignment(),
            "n_tensors": f.tensors().len(),
            "n_params": n_params,
            "quant_mix": mix.iter().map(|(k, (n, b))| (k.to_string(), json!({"tensors": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "metadata": f.metadata().iter().filter(|(k, _)| k != "tokenizer.chat_template").map(|(k, v)| (k.clone(), v.to_json(JSON_ARRAY_ITEMS))).collect::<serde_json::Map<_, _>>(),
        });
        match &hp {
            Ok(hp) => v["hparams"] = serde_json::to_value(hp).unwrap_or_default(),
            Err(e) => v["hparams_error"] = json!(e.to_string()),
        }
        if let Some(l) = &loaded {
            v["load_seconds"] = json!(l.seconds);
            v["backends"] = l.backends.iter().map(|(n, d, w, b)| json!({"name": n, "device": d, "weight_bytes": w, "buffer_bytes": b})).collect();
        }
        if tensors {
            v["tensors"] = f
                .tensors()
                .iter()
                .map(|t| json!({"name": t.name, "type": t.type_name(), "dims": t.dims, "bytes": t.n_bytes, "offset": t.offset}))
                .collect();
        }
        return out.line(serde_json::to_string_pretty(&v).unwrap_or_default());
    }

    let name = f.opt_str("general.name").ok().flatten().unwrap_or("-");
    out.line(format!("file:              {} ({}, {} bytes)", path.display(), mib(f.file_size()), f.file_size()))?;
    out.line(format!("gguf:              version {}, alignment {}, {} tensors, {} metadata keys", f.version(), f.alignment(), f.tensors().len(), f.metadata().len()))?;
    out.line(format!("name:              {name}"))?;
    match &hp {
        Ok(hp) => {
            out.line(format!("architecture:      {}", hp.arch))?;
            out.line(format!("parameters:        {:.2} M", n_params as f64 / 1e6))?;
            out.line(format!("block count:       {}", hp.n_layer))?;
            out.line(format!("embedding length:  {}", hp.n_embd))?;
            out.line(format!("heads:             {}", hp.n_head))?;
            out.line(format!("kv heads:          {}", hp.n_head_kv))?;
            match hp.head_dim_v == hp.head_dim {
                true => out.line(format!("head dim:          {}", hp.head_dim))?,
                false => out.line(format!("head dim:          {} (k), {} (v)", hp.head_dim, hp.head_dim_v))?,
            }
            out.line(format!("ffn length:        {}", hp.n_ff))?;
            out.line(format!("context length:    {}", hp.n_ctx_train))?;
            let rotated = match hp.n_rot == hp.head_dim {
                true => "whole heads".to_string(),
                false => format!("{} of {} dims", hp.n_rot, hp.head_dim),
            };
            out.line(format!("rope:              {}, {rotated}", hp.rope_style.name()))?;
            out.line(format!("rope base:         {}", hp.rope_freq_base))?;
            if hp.n_swa > 0 {
                let windowed: Vec<usize> = (0..hp.n_layer as usize).filter(|&il| hp.is_swa(il)).collect();
                let global: Vec<String> = (0..hp.n_layer as usize).filter(|&il| !hp.is_swa(il)).map(|il| il.to_string()).collect();
                out.line(format!(
                    "sliding window:    {} cells on {} of {} layers (global: {}), rope base {} there",
                    hp.n_swa,
                    windowed.len(),
                    hp.n_layer,
                    if global.is_empty() { "none".to_string() } else { global.join(", ") },
                    hp.rope_freq_base_swa
                ))?;
            }
            if let Some(scale) = hp.attn_scale {
                out.line(format!("attention scale:   {scale}"))?;
            }
            out.line(format!("rms eps:           {:e}", hp.rms_eps))?;
            out.line(format!("vocab size:        {}", hp.n_vocab))?;
        }
        Err(e) => out.line(format!("hyper-parameters:  unavailable ({e})"))?,
    }
    if let Ok(Some(model)) = f.opt_str("tokenizer.ggml.model") {
        let pre = f.opt_str("tokenizer.ggml.pre").ok().flatten().unwrap_or("-");
        out.line(format!("tokenizer:         {model} (pre {pre})"))?;
    }
    out.line("quant mix:")?;
    for (ty, (n, bytes)) in &mix {
        out.line(format!("  {ty:<6} {n:>4} tensors  {}", mib(*bytes)))?;
    }
    if let Some(l) = &loaded {
        out.line(format!("loaded in:         {:.2} s (weights offered to each backend, arenas and KV reserved)", l.seconds))?;
        for (n, d, w, b) in &l.backends {
            let weights = match (*n == "cpu", *w > 0) {
                (true, true) => format!("weights read from the file's map, repacked copies {}", mib(*w as u64)),
                (true, false) => "weights read from the file's map".to_string(),
                (false, _) => format!("weights {} on the device", mib(*w as u64)),
            };
            out.line(format!("backend {n:<10} {d}: {weights}, buffers {}", mib(*b as u64)))?;
        }
    }
    if tensors {
        out.line(format!("{:<40} {:<7} {:<24} {:>12} {:>12}", "tensor", "type", "dims", "bytes", "offset"))?;
        for t in f.tensors() {
            let dims = format!("{:?}", t.dims);
            out.line(format!("{:<40} {:<7} {:<24} {:>12} {:>12}", t.name, t.type_name(), dims, t.n_bytes, t.offset))?;
        }
    }
    Ok(())
}
