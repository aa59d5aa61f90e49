//! `minfer bench`: llama-bench's table and JSON shapes, and its argument errors.

mod common;

use std::process::Command;

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().expect("run minfer")
}

#[test]
fn json_has_llama_bench_fields() {
    let m = common::model_path(common::QWEN3_TINY);
    let out = minfer(&["bench", "-m", m.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "2", "-t", "1", "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0]["n_prompt"].as_u64(), rows[0]["n_gen"].as_u64()), (Some(8), Some(0)));
    assert_eq!((rows[1]["n_prompt"].as_u64(), rows[1]["n_gen"].as_u64()), (Some(0), Some(4)));
    for r in rows {
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert_eq!(r["n_threads"], 1);
    }
}

#[test]
fn markdown_has_llama_bench_columns() {
    let m = common::model_path(common::QWEN3_TINY);
    let out = minfer(&["bench", "-m", m.to_str().unwrap(), "-p", "4", "-n", "0", "-r", "1"]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines[0], "| model | size | params | backend | threads | test | t/s |");
    assert_eq!(lines.len(), 3, "{s}");
    assert!(lines[2].contains("| pp4 |") && lines[2].contains(" ± "), "{s}");
}

#[test]
fn nothing_to_measure_is_an_error() {
    let m = common::model_path(common::QWEN3_TINY);
    let out = minfer(&["bench", "-m", m.to_str().unwrap(), "-p", "0", "-n", "0"]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}

#[test]
fn depth_runs_each_test_after_that_many_tokens() {
    let m = common::model_path(common::QWEN3_TINY);
    let args = ["bench", "-m", m.to_str().unwrap(), "-p", "4", "-n", "2", "-d", "24", "-r", "2", "-t", "1"];
    let out = minfer(&[&args[..], &["-o", "json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["n_depth"], 24, "{r}");
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
    }
    let md = minfer(&args);
    assert!(md.status.success());
    let s = String::from_utf8(md.stdout).unwrap();
    assert!(s.contains("| pp4 @ d24 |") && s.contains("| tg2 @ d24 |"), "{s}");
}

#[test]
fn batched_json_has_llama_batched_bench_fields_and_speeds() {
    let m = common::model_path(common::QWEN3_TINY);
    let out = minfer(&["bench", "-m", m.to_str().unwrap(), "--batch", "1,3", "-p", "6", "-n", "4", "-r", "1", "-t", "1", "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["pl"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 3]);
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        let b = f("pl");
        assert_eq!((f("pp"), f("tg"), f("n_kv")), (6.0, 4.0, b * 10.0));
        // llama-batched-bench's definitions, by hand.
        assert!((f("speed_pp") - b * 6.0 / f("t_pp")).abs() < 1e-6 * f("speed_pp"));
        assert!((f("speed_tg") - b * 4.0 / f("t_tg")).abs() < 1e-6 * f("speed_tg"));
        assert!((f("t") - (f("t_pp") + f("t_tg"))).abs() < 1e-9);
        assert!((f("speed") - b * 10.0 / f("t")).abs() < 1e-6 * f("speed"));
        assert_eq!(r["n_threads"], 1);
    }
}

#[test]
fn batched_markdown_has_llama_batched_bench_columns_and_refuses_depth() {
    let m = common::model_path(common::QWEN3_TINY);
    let out = minfer(&["bench", "-m", m.to_str().unwrap(), "--batch", "2", "-p", "4", "-n", "2", "-r", "1"]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |"), "{s}");
    assert!(s.lines().last().unwrap().starts_with("|     4 |      2 |    2 |     12 |"), "{s}");
    let out = minfer(&["bench", "-m", m.to_str().unwrap(), "--batch", "2", "-d", "8"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-d does not apply to --batch"));
}
