//! Graphviz export: `dot -Tpng g.dot -o g.png`.
//!
//! One node per `CNode`, labelled with its name, op payload, shape and dtype, filled by backend
//! colour (from the registry: CPU light yellow, Metal light blue, CUDA light green; unassigned
//! white); inputs and outputs are double circles; dead nodes (fusion orphans) are dashed; one
//! edge per source.

use std::io::{self, Write};

use super::ComputeGraph;

/// Fill colour of nodes without a backend.
pub const UNASSIGNED_COLOR: &str = "white";

/// A DOT string literal body: backslashes and quotes escaped, newlines as `\n`.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl ComputeGraph {
    /// Writes the graph as a Graphviz digraph.
    pub fn dump_dot(&self, w: &mut dyn Write) -> io::Result<()> {
        let live = self.live_mask();
        writeln!(w, "digraph minfer {{")?;
        writeln!(w, "  rankdir=TB;")?;
        // Bounded layout effort: the positions input and the KV loads feed every layer, and
        // dot's network simplex spends minutes on those long edges in a 440-node pass; with
        // these limits `dot -Tsvg` takes seconds.
        writeln!(w, "  nslimit=2; mclimit=0.5;")?;
        writeln!(w, "  node [fontname=\"monospace\"];")?;
        for node in &self.nodes {
            let io_node = self.inputs.contains(&node.id) || self.outputs.contains(&node.id);
            let shape = if io_node { "doublecircle" } else { "box" };
            let color = node
                .backend
                .and_then(|b| super::registry::BUILTIN.iter().find(|e| e.handle == b))
                .map_or(UNASSIGNED_COLOR, |e| e.color);
            let style = if live.get(node.id).copied().unwrap_or(false) {
                "filled"
            } else {
                "filled,dashed"
            };
            let backend = node.backend.map_or("-", |b| b.name());
            let label = format!(
                "{} (#{})\n{:?}\n{:?} {} @{}",
                node.name,
                node.id,
                node.op,
                node.out_shape,
                node.out_dtype.name(),
                backend
            );
            writeln!(
                w,
                "  n{} [label=\"{}\", shape={shape}, style=\"{style}\", fillcolor=\"{color}\"];",
                node.id,
                escape(&label)
            )?;
        }
        for node in &self.nodes {
            for &s in &node.src {
                writeln!(w, "  n{s} -> n{};", node.id)?;
            }
        }
        writeln!(w, "}}")
    }

    /// The DOT text as a `String`.
    pub fn to_dot(&self) -> String {
        let mut buf = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.dump_dot(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}
