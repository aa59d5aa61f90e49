//! `--dump-graph FILE` / `--dump-graph-json FILE`: the prompt's forward pass as the engine would
//! run it (backends assigned, fusion applied), written out instead of executed.

use std::path::Path;

use super::CliError;
use crate::generate::Engine;

pub fn dump_graphs(engine: &Engine, n_prompt: usize, dot: Option<&Path>, json: Option<&Path>) -> Result<(), CliError> {
    let (graph, params) = engine.preview_graph(n_prompt.max(1), 1)?;
    let write = |path: &Path, bytes: Vec<u8>| {
        std::fs::write(path, bytes).map_err(|source| CliError::WriteFile { path: path.to_path_buf(), source })
    };
    if let Some(p) = dot {
        write(p, graph.to_dot().into_bytes())?;
    }
    if let Some(p) = json {
        let v = graph.export_json(Some(&params), Some(&engine.model().display_name()));
        write(p, serde_json::to_vec_pretty(&v).unwrap_or_default())?;
    }
    eprintln!("minfer: graph of {} nodes for {} tokens written", graph.nodes.len(), params.n_tokens);
    Ok(())
}
