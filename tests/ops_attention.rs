//! Attention: against a naive f64 implementation (budget), batch invariance (a prefill gives
//! every token the bits it gets alone in a decode step), thread-count independence, and the
//! error cases of `attention` and `kv_store`.

mod common;

use minfer::backends::cpu::kernels::{self, AttnArgs, Isa, OpsError, Pool};

fn rng(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    common::rng::symmetric(seed, n, scale)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

struct Geo {
    hd: usize,
    nh: usize,
    nkv: usize,
}

const GEOS: [Geo; 3] = [
    Geo {
        hd: 64,
        nh: 14,
        nkv: 2,
    },
    Geo {
        hd: 128,
        nh: 4,
        nkv: 4,
    },
    Geo {
        hd: 40,
        nh: 6,
        nkv: 3,
    },
];

fn args<'a>(
    g: &Geo,
    q: &'a [f32],
    kc: &'a [f32],
    vc: &'a [f32],
    positions: &'a [i32],
) -> AttnArgs<'a> {
    AttnArgs {
        q,
        k_cache: kc,
        v_cache: vc,
        positions,
        n_head: g.nh,
        n_head_kv: g.nkv,
        head_dim: g.hd,
        scale: 1.0 / (g.hd as f32).sqrt(),
        window: None,
    }
}

fn naive(a: &AttnArgs) -> Vec<f64> {
    let (hd, nh) = (a.head_dim, a.n_head);
    let w = a.n_head_kv * hd;
    let mut out = vec![0.0; a.q.len()];
    for (t, &p) in a.positions.iter().enumerate() {
        for h in 0..nh {
            let q = &a.q[(t * nh + h) * hd..][..hd];
            let kv = h / (nh / a.n_head_kv) * hd;
            // The attended cells: `p - window < j <= p` (all of `0..=p` without a window).
            let first = a.window.map_or(0, |w| (p as usize + 1).saturating_sub(w));
            let cells = first..=p as usize;
            let scores: Vec<f64> = cells
                .clone()
                .map(|j| {
                    let k = &a.k_cache[j * w + kv..][..hd];
                    q.iter()
                        .zip(k)
                        .map(|(x, y)| *x as f64 * *y as f64)
                        .sum::<f64>()
                        * a.scale as f64
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                out[(t * nh + h) * hd + d] = e
                    .iter()
                    .zip(cells.clone())
                    .map(|(ej, j)| ej / z * a.v_cache[j * w + kv + d] as f64)
                    .sum();
            }
        }
    }
    out
}

#[test]
fn attention_against_naive_f64() {
    let pool = Pool::new(2).unwrap();
    for g in &GEOS {
        let n_ctx = 300;
        let w = g.nkv * g.hd;
        let (kc, vc) = (rng(1, n_ctx * w, 1.5), rng(2, n_ctx * w, 1.5));
        let positions = [0, 3, 64, 130, 299];
        let q = rng(3, positions.len() * g.nh * g.hd, 1.5);
        let a = args(g, &q, &kc, &vc, &positions);
        let mut out = vec![0.0; q.len()];
        kernels::attention(&pool, &a, &mut out).unwrap();
        let want = naive(&a);
        let worst = out
            .iter()
            .zip(&want)
            .map(|(o, w)| (*o as f64 - w).abs())
            .fold(0.0, f64::max);
        // Outputs are convex combinations of values within 1.5; f32 scores over up to 128 terms.
        assert!(worst < 2e-6, "hd {} worst {worst}", g.hd);
        // Position 0 attends only cell 0: the output is V's row 0 exactly.
        for h in 0..g.nh {
            let kv = h / (g.nh / g.nkv) * g.hd;
            assert_eq!(&out[h * g.hd..][..g.hd], &vc[kv..][..g.hd]);
        }
    }
}

/// A sliding window: only the last `window` cells up to the position count, whatever the cells
/// before hold (here: huge values that would dominate the softmax if they leaked in).
#[test]
fn sliding_window_against_naive_f64() {
    let pool = Pool::new(2).unwrap();
    for g in &GEOS {
        let n_ctx = 300;
        let w = g.nkv * g.hd;
        let (mut kc, vc) = (rng(5, n_ctx * w, 1.5), rng(6, n_ctx * w, 1.5));
        let positions = [0, 3, 63, 64, 65, 130, 200, 299];
        let q = rng(7, positions.len() * g.nh * g.hd, 1.5);
        for window in [1, 5, 64, 70, 128, 400] {
            let a = AttnArgs { window: Some(window), ..args(g, &q, &kc, &vc, &positions) };
            let mut out = vec![0.0; q.len()];
            kernels::attention(&pool, &a, &mut out).unwrap();
            let want = naive(&a);
            let worst = out.iter().zip(&want).map(|(o, w)| (*o as f64 - w).abs()).fold(0.0, f64::max);
            assert!(worst < 2e-6, "hd {} window {window}: worst {worst}", g.hd);
            // Window 1: every token attends only its own cell, so the output is its V row.
            if window == 1 {
                for (t, &p) in positions.iter().enumerate() {
                    // Head 0 reads KV head 0.
                    assert_eq!(&out[t * g.nh * g.hd..][..g.hd], &vc[p as usize * w..][..g.hd], "window 1, token {t}");
                }
            }
        }
        // Poison the cells before every window: the windowed result does not move.
        let q1 = &q[..g.nh * g.hd];
        let a = AttnArgs { window: Some(50), ..args(g, q1, &kc, &vc, &[299]) };
        let mut before = vec![0.0; g.nh * g.hd];
        kernels::attention(&pool, &a, &mut before).unwrap();
        kc[..250 * w].iter_mut().for_each(|x| *x = 1e4);
        let a = AttnArgs { window: Some(50), ..args(g, q1, &kc, &vc, &[299]) };
        let mut after = vec![0.0; g.nh * g.hd];
        kernels::attention(&pool, &a, &mut after).unwrap();
        assert_eq!(bits(&before), bits(&after), "hd {}: cells outside the window leaked in", g.hd);
    }
}

/// A window of 0 (refused by the graph builder, but not by the kernel) at a position whose span
/// would start a 64-cell block leaves every query an empty probability row: each result is
/// still written, +0 (no cell reaches a slot), on every ISA, whatever `out` held.
#[test]
fn an_empty_window_writes_zeros() {
    let pool = Pool::new(2).unwrap();
    for g in &GEOS {
        let n_ctx = 200;
        let w = g.nkv * g.hd;
        let (kc, vc) = (rng(8, n_ctx * w, 1.5), rng(9, n_ctx * w, 1.5));
        for positions in [[63], [127]] {
            let q = rng(10, g.nh * g.hd, 1.5);
            let a = AttnArgs { window: Some(0), ..args(g, &q, &kc, &vc, &positions) };
            for isa in kernels::Isa::supported() {
                let mut out = vec![f32::NAN; q.len()];
                kernels::attention_with(isa, &pool, &a, &mut out).unwrap();
                assert!(out.iter().all(|x| x.to_bits() == 0), "hd {} position {positions:?} {isa:?}", g.hd);
            }
        }
    }
}

#[test]
fn prefill_of_9_equals_9_decode_steps_bitwise() {
    let pool = Pool::new(2).unwrap();
    for g in &GEOS {
        let n_ctx = 16;
        let nt = 9;
        let w = g.nkv * g.hd;
        let (k_new, v_new) = (rng(4, nt * w, 1.0), rng(5, nt * w, 1.0));
        let q = rng(6, nt * g.nh * g.hd, 1.0);
        let positions: Vec<i32> = (0..nt as i32).collect();

        // Prefill: store the 9 rows, attend all 9 tokens at once.
        let (mut kc, mut vc) = (vec![0.0; n_ctx * w], vec![0.0; n_ctx * w]);
        kernels::kv_store(&k_new, &v_new, &positions, n_ctx, &mut kc, &mut vc).unwrap();
        let mut prefill = vec![0.0; q.len()];
        kernels::attention(&pool, &args(g, &q, &kc, &vc, &positions), &mut prefill).unwrap();

        // Decode: one token per step, the cache growing by one row each time.
        let (mut kc, mut vc) = (vec![0.0; n_ctx * w], vec![0.0; n_ctx * w]);
        let qw = g.nh * g.hd;
        for t in 0..nt {
            let cell = [t as i32];
            kernels::kv_store(
                &k_new[t * w..][..w],
                &v_new[t * w..][..w],
                &cell,
                n_ctx,
                &mut kc,
                &mut vc,
            )
            .unwrap();
            let mut one = vec![0.0; qw];
            kernels::attention(
                &pool,
                &args(g, &q[t * qw..][..qw], &kc, &vc, &cell),
                &mut one,
            )
            .unwrap();
            assert_eq!(
                bits(&one),
                bits(&prefill[t * qw..][..qw]),
                "hd {} token {t}",
                g.hd
            );
        }

        // A prefill of 4 then 5 decode steps as well.
        let (mut kc, mut vc) = (vec![0.0; n_ctx * w], vec![0.0; n_ctx * w]);
        kernels::kv_store(
            &k_new[..4 * w],
            &v_new[..4 * w],
            &positions[..4],
            n_ctx,
            &mut kc,
            &mut vc,
        )
        .unwrap();
        let mut first = vec![0.0; 4 * qw];
        kernels::attention(
            &pool,
            &args(g, &q[..4 * qw], &kc, &vc, &positions[..4]),
            &mut first,
        )
        .unwrap();
        assert_eq!(bits(&first), bits(&prefill[..4 * qw]));
    }
}

#[test]
fn thread_count_does_not_change_bits() {
    let g = &GEOS[0];
    let n_ctx = 200;
    let w = g.nkv * g.hd;
    let (kc, vc) = (rng(7, n_ctx * w, 1.0), rng(8, n_ctx * w, 1.0));
    let positions: Vec<i32> = (0..13).map(|i| i * 15).collect();
    let q = rng(9, positions.len() * g.nh * g.hd, 1.0);
    let a = args(g, &q, &kc, &vc, &positions);
    let mut reference = vec![0.0; q.len()];
    kernels::attention(&Pool::new(1).unwrap(), &a, &mut reference).unwrap();
    for threads in [2, 3] {
        for isa in Isa::supported() {
            let mut out = vec![0.0; q.len()];
            kernels::attention_with(isa, &Pool::new(threads).unwrap(), &a, &mut out).unwrap();
            assert_eq!(bits(&out), bits(&reference), "{threads} threads {isa:?}");
        }
    }
}

#[test]
fn attention_errors() {
    let pool = Pool::new(1).unwrap();
    let g = Geo {
        hd: 8,
        nh: 4,
        nkv: 2,
    };
    let (kc, vc) = (vec![0.0; 10 * 16], vec![0.0; 10 * 16]);
    let q = vec![0.0; 32];
    let mut out = vec![0.0; 32];
    let ok = args(&g, &q, &kc, &vc, &[9]);
    kernels::attention(&pool, &ok, &mut out).unwrap();

    let e = kernels::attention(&pool, &args(&g, &q, &kc, &vc, &[10]), &mut out).unwrap_err();
    assert_eq!(
        e,
        OpsError::Position {
            token: 0,
            pos: 10,
            n_ctx: 10
        }
    );
    let e = kernels::attention(&pool, &args(&g, &q, &kc, &vc, &[-1]), &mut out).unwrap_err();
    assert_eq!(
        e,
        OpsError::Position {
            token: 0,
            pos: -1,
            n_ctx: 10
        }
    );
    let e = kernels::attention(&pool, &AttnArgs { n_head_kv: 3, ..ok }, &mut out).unwrap_err();
    assert_eq!(
        e,
        OpsError::HeadGroups {
            n_head: 4,
            n_head_kv: 3
        }
    );
    assert!(matches!(
        kernels::attention(&pool, &AttnArgs { n_head_kv: 0, ..ok }, &mut out),
        Err(OpsError::HeadGroups { .. })
    ));
    assert!(matches!(
        kernels::attention(&pool, &AttnArgs { head_dim: 0, ..ok }, &mut out),
        Err(OpsError::BadDim { .. })
    ));
    assert!(matches!(
        kernels::attention(&pool, &AttnArgs { q: &q[..31], ..ok }, &mut out),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::attention(&pool, &ok, &mut out[..31]),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::attention(
            &pool,
            &AttnArgs {
                k_cache: &kc[..150],
                ..ok
            },
            &mut out
        ),
        Err(OpsError::Ragged { .. })
    ));
    assert!(matches!(
        kernels::attention(
            &pool,
            &AttnArgs {
                v_cache: &vc[..144],
                ..ok
            },
            &mut out
        ),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::attention(
            &pool,
            &AttnArgs {
                positions: &[0, 1],
                ..ok
            },
            &mut out
        ),
        Err(OpsError::Length { .. })
    ));
}

#[test]
fn kv_store_writes_rows_and_rejects_bad_cells() {
    let (mut kc, mut vc) = (vec![0.0; 4 * 3], vec![0.0; 4 * 3]);
    let k = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let v = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0];
    kernels::kv_store(&k, &v, &[3, 1], 4, &mut kc, &mut vc).unwrap();
    assert_eq!(
        kc,
        [0.0, 0.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]
    );
    assert_eq!(
        vc,
        [
            0.0, 0.0, 0.0, -4.0, -5.0, -6.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0
        ]
    );

    // A bad cell anywhere is reported and nothing is written.
    let before = (kc.clone(), vc.clone());
    let e = kernels::kv_store(&k, &v, &[0, 4], 4, &mut kc, &mut vc).unwrap_err();
    assert_eq!(
        e,
        OpsError::Cell {
            token: 1,
            cell: 4,
            n_ctx: 4
        }
    );
    assert!(e.to_string().contains("cell 4"));
    assert_eq!((kc.clone(), vc.clone()), before);
    assert!(matches!(
        kernels::kv_store(&k, &v, &[-1, 0], 4, &mut kc, &mut vc),
        Err(OpsError::Cell { cell: -1, .. })
    ));
    assert!(matches!(
        kernels::kv_store(&k, &v[..5], &[0, 1], 4, &mut kc, &mut vc),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::kv_store(&k[..5], &v[..5], &[0, 1], 4, &mut kc, &mut vc),
        Err(OpsError::Ragged { .. })
    ));
    assert!(matches!(
        kernels::kv_store(&k, &v, &[0, 1], 5, &mut kc, &mut vc),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::kv_store(&k, &v, &[], 4, &mut kc, &mut vc),
        Err(OpsError::Length { .. })
    ));
    kernels::kv_store(&[], &[], &[], 4, &mut kc, &mut vc).unwrap();
}

/// Several sequences' runs handed to the workers together (`attention_runs`, the batched
/// decode's path): every run gets the bits it gets alone, for runs of one token (written in
/// place) and of several (staged), and the naive f64 result within the budget of
/// `attention_against_naive_f64` (both ISAs); a bad run is an error before anything is written.
#[test]
fn runs_together_match_each_run_alone() {
    for threads in [1, 2, 3] {
        let pool = Pool::new(threads).unwrap();
        for g in &GEOS {
            let n_ctx = 200;
            let w = g.nkv * g.hd;
            // Each run has its own regions (as the batch's sequences from their first cell).
            let caches: Vec<(Vec<f32>, Vec<f32>)> = (0..4).map(|s| (rng(10 + s, n_ctx * w, 1.5), rng(20 + s, n_ctx * w, 1.5))).collect();
            let positions: [&[i32]; 4] = [&[57], &[0, 1, 2, 3, 4, 5, 6], &[199], &[130, 131]];
            let qs: Vec<Vec<f32>> = positions.iter().enumerate().map(|(s, p)| rng(30 + s as u32, p.len() * g.nh * g.hd, 1.5)).collect();
            let alone: Vec<Vec<f32>> = (0..4)
                .map(|s| {
                    let mut out = vec![0.0; qs[s].len()];
                    kernels::attention(&pool, &args(g, &qs[s], &caches[s].0, &caches[s].1, positions[s]), &mut out).unwrap();
                    out
                })
                .collect();
            for isa in [Isa::detected(), Isa::Scalar] {
                let mut outs: Vec<Vec<f32>> = qs.iter().map(|q| vec![f32::NAN; q.len()]).collect();
                let mut runs: Vec<kernels::AttnRun> = outs
                    .iter_mut()
                    .enumerate()
                    .map(|(s, out)| kernels::AttnRun { args: args(g, &qs[s], &caches[s].0, &caches[s].1, positions[s]), out })
                    .collect();
                kernels::attention_runs_with(isa, &pool, &mut runs).unwrap();
                for s in 0..4 {
                    let a = args(g, &qs[s], &caches[s].0, &caches[s].1, positions[s]);
                    if isa == Isa::detected() {
                        assert_eq!(bits(&outs[s]), bits(&alone[s]), "threads {threads} hd {} run {s}", g.hd);
                    }
                    let want = naive(&a);
                    for (x, y) in outs[s].iter().zip(&want) {
                        assert!((*x as f64 - y).abs() < 2e-6, "{isa:?} threads {threads} hd {} run {s}: {x} vs {y}", g.hd);
                    }
                }
            }
            // A run past its region is refused, and no run's output is touched.
            let bad: [i32; 1] = [n_ctx as i32];
            let mut outs: Vec<Vec<f32>> = vec![vec![7.0; g.nh * g.hd]; 2];
            let (o0, o1) = outs.split_at_mut(1);
            let mut runs = [
                kernels::AttnRun { args: args(g, &qs[0], &caches[0].0, &caches[0].1, positions[0]), out: &mut o0[0] },
                kernels::AttnRun { args: args(g, &qs[2], &caches[2].0, &caches[2].1, &bad), out: &mut o1[0] },
            ];
            assert!(matches!(kernels::attention_runs(&pool, &mut runs), Err(OpsError::Position { .. })));
            assert!(outs.iter().flatten().all(|&x| x == 7.0));
        }
    }
}
