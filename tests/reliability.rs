//! The server's reliability suite: `minfer serve` processes on the tiny Qwen3 model under load
//! with disconnects, slow (slowloris) clients, floods of hostile requests, and a SIGTERM while
//! streams run. Every section asserts its bar and adds its figures to a report, printed and
//! written to `target/reliability/report.md` (the source of docs/RELIABILITY.md).
//!
//! `MINFER_RELIABILITY_LOAD_SECS` sets the load run's length (default 60 s, the bar).
//! The hostile chat templates have their own file, `tests/reliability_templates.rs`.

mod common;
#[path = "reliability/http.rs"]
mod http;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Server, Streamed, post_json, quantile, request, stream};
use serde_json::{Value as Json, json};

const T: Duration = Duration::from_secs(120);

fn tiny() -> std::path::PathBuf {
    common::model_path(common::QWEN3_TINY)
}

/// The requests of the load run: completions and chat, greedy, of different lengths.
fn load_requests() -> Vec<(&'static str, Json)> {
    let topics = ["rivers", "a lighthouse", "prime numbers", "the moon", "bread", "rain", "chess", "glass"];
    let mut v = Vec::new();
    for (i, t) in topics.iter().enumerate() {
        let max_tokens = 8 + 8 * (i % 4);
        v.push(("/v1/completions", json!({"prompt": format!("A short note about {t}:"), "max_tokens": max_tokens, "temperature": 0, "stream": true})));
        v.push((
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": format!("Tell me about {t}.")}], "max_tokens": max_tokens, "temperature": 0, "stream": true}),
        ));
    }
    v
}

/// A tiny deterministic generator (xorshift) so a failing run can be repeated.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Waits until the server's admission, queue and slots are back to idle; returns the time.
fn until_idle(s: &Server, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        let m = s.metrics();
        let zero = |k: &str| m.get(k).copied() == Some(0.0);
        if zero("minfer_requests_inside") && zero("minfer_slots_busy") && zero("minfer_queue_depth") {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[derive(Default)]
struct Report {
    lines: Vec<String>,
}

impl Report {
    fn say(&mut self, line: impl Into<String>) {
        let l = line.into();
        println!("{l}");
        self.lines.push(l);
    }
}

/// 64 streaming clients over 4 slots, a third of them leaving at a random point.
fn load(report: &mut Report) {
    let secs: u64 = std::env::var("MINFER_RELIABILITY_LOAD_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let mut srv = Server::start(&tiny(), &["--slots", "4", "--ctx", "4096", "-t", "2", "--queue", "64"]);
    let port = srv.port;
    let reqs = Arc::new(load_requests());
    // Each request alone first: what every completed response must equal.
    let alone: Vec<(String, Option<String>)> = reqs
        .iter()
        .map(|(path, body)| {
            let s = stream(port, path, body, None, T).expect("request alone");
            assert!(s.done && s.error.is_none(), "{path} {body}: {s:?}");
            (s.text, s.finish_reason)
        })
        .collect();
    let alone = Arc::new(alone);
    let rss_before = srv.peak_rss_mib();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let errors = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let (completed, left, mismatched) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let clients: Vec<_> = (0..64u64)
        .map(|c| {
            let (reqs, alone, latencies, errors) = (reqs.clone(), alone.clone(), latencies.clone(), errors.clone());
            let (completed, left, mismatched) = (completed.clone(), left.clone(), mismatched.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (c + 1).wrapping_mul(0x1234_5677));
                while Instant::now() < deadline {
                    let i = rng.below(reqs.len() as u64) as usize;
                    let (path, body) = &reqs[i];
                    // A third leave after 0..=5 frames (0: as soon as the headers are in).
                    let stop = (rng.below(3) == 0).then(|| rng.below(6) as usize);
                    let t0 = Instant::now();
                    let bump = |k: String| *errors.lock().unwrap().entry(k).or_default() += 1;
                    match stream(port, path, body, stop, T) {
                        Err(e) => bump(format!("io: {}", e.kind())),
                        Ok(s) if s.status != 200 => bump(format!("HTTP {}", s.status)),
                        Ok(Streamed { error: Some(e), .. }) => bump(format!("stream error: {}", e["error"]["type"])),
                        Ok(s) if stop.is_some() && !s.done => {
                            left.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(s) => {
                            latencies.lock().unwrap().push(t0.elapsed().as_secs_f64() * 1e3);
                            completed.fetch_add(1, Ordering::Relaxed);
                            if (&s.text, &s.finish_reason) != (&alone[i].0, &alone[i].1) {
                                mismatched.fetch_add(1, Ordering::Relaxed);
                                eprintln!("mismatch on request {i}: {:?} vs alone {:?}", s.text, alone[i].0);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a load client panicked");
    }
    let idle_after = until_idle(&srv, Duration::from_secs(20));
    let m = srv.metrics();
    let mut lat = latencies.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    let (completed, left, mismatched) = (completed.load(Ordering::Relaxed), left.load(Ordering::Relaxed), mismatched.load(Ordering::Relaxed));
    report.say(format!(
        "| load | {secs} s, 64 streaming clients, 4 slots, 1/3 leave early | {} requests: {completed} completed, {left} left early | {errors:?} | p50 {:.0} ms, p99 {:.0} ms | {:.0} MiB (before {rss_before:.0}) | panics {}, leaked slots {}, back to idle in {:?} |",
        completed + left + errors.values().sum::<usize>(),
        quantile(&mut lat, 0.5),
        quantile(&mut lat, 0.99),
        srv.peak_rss_mib(),
        m["minfer_panics_total"],
        m["minfer_slots_busy"],
        idle_after,
    ));
    assert!(errors.is_empty(), "errors under load: {errors:?}");
    assert_eq!(mismatched, 0, "completed responses that differ from the same request run alone");
    assert!(completed >= 64 && left > 0, "completed {completed}, left {left}");
    assert!(idle_after.is_some(), "slots, queue or admission still busy after the load: {m:?}");
    assert_eq!(m["minfer_panics_total"], 0.0);
    assert!(m["minfer_cancelled_total"] > 0.0, "disconnects cancel generations");
    assert!(srv.drain_log().iter().all(|l| !l.contains("panicked")), "{:?}", srv.log);
}

/// 200 connections trickling header bytes (and 10 trickling a body): normal requests keep
/// their latency, and every slow connection is dropped at the read timeout without taking a
/// slot.
fn slowloris(report: &mut Report) {
    let read_timeout = 10; // the default
    let srv = Server::start(&tiny(), &["--slots", "2", "-t", "2"]);
    let port = srv.port;
    let normal = json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0});
    let timed = || {
        let t0 = Instant::now();
        let r = post_json(port, "/v1/completions", &normal, T).expect("a normal request");
        assert_eq!(r.status, 200);
        t0.elapsed().as_secs_f64()
    };
    let baseline: Vec<f64> = (0..5).map(|_| timed()).collect();
    let base_max = baseline.iter().copied().fold(0.0, f64::max);
    let start = Instant::now();
    let head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let mut socks: Vec<std::net::TcpStream> = (0..200).map(|_| http::connect(port, T).unwrap()).collect();
    // Body tricklers: whole headers, then a byte a second of a 200-byte body.
    let mut bodies: Vec<std::net::TcpStream> = (0..10)
        .map(|_| {
            let mut s = http::connect(port, T).unwrap();
            use std::io::Write;
            s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{").unwrap();
            s
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let drops = Arc::new(Mutex::new(Vec::<f64>::new()));
    let statuses = Arc::new(Mutex::new(Vec::<String>::new()));
    let trickler = {
        let (stop, drops, statuses) = (stop.clone(), drops.clone(), statuses.clone());
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut at = 0;
            let mut alive: Vec<Option<std::net::TcpStream>> = socks.drain(..).chain(bodies.drain(..)).map(Some).collect();
            while !stop.load(Ordering::Relaxed) && alive.iter().any(Option::is_some) {
                for (k, slot) in alive.iter_mut().enumerate() {
                    let Some(s) = slot else { continue };
                    let byte = if k < 200 { head[at % head.len()] } else { b' ' };
                    s.set_nonblocking(true).unwrap();
                    let mut buf = [0u8; 512];
                    let closed = match s.read(&mut buf) {
                        Ok(0) => true,
                        Ok(n) => {
                            let text = String::from_utf8_lossy(&buf[..n]);
                            statuses.lock().unwrap().push(text.get(9..12).unwrap_or("?").to_string());
                            true
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => s.write(&[byte]).is_err(),
                        Err(_) => true,
                    };
                    if closed {
                        drops.lock().unwrap().push(start.elapsed().as_secs_f64());
                        *slot = None;
                    }
                }
                at += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let during: Vec<f64> = (0..10).map(|_| timed()).collect();
    let inside = srv.metrics()["minfer_requests_inside"];
    let worst = during.iter().copied().fold(0.0, f64::max);
    // Every slow connection is gone by the read timeout plus the trickler's tick.
    while start.elapsed() < Duration::from_secs(read_timeout + 5) && drops.lock().unwrap().len() < 210 {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    let mut drops = drops.lock().unwrap().clone();
    let statuses = statuses.lock().unwrap().clone();
    let body_408 = statuses.iter().filter(|s| *s == "408").count();
    report.say(format!(
        "| slowloris | 200 connections trickling headers + 10 trickling a body, --read-timeout {read_timeout} s | normal requests: baseline max {:.0} ms, during max {:.0} ms | dropped {} of 210, first at {:.1} s, last at {:.1} s; body tricklers answered 408: {body_408} | requests inside during: {inside} |",
        base_max * 1e3,
        worst * 1e3,
        drops.len(),
        quantile(&mut drops, 0.0),
        quantile(&mut drops, 1.0),
    ));
    assert!(worst <= base_max + 1.0, "normal requests slowed: {during:?} against {baseline:?}");
    assert_eq!(drops.len(), 210, "slow connections still open after {} s", read_timeout + 5);
    assert!(drops.iter().all(|&t| t >= read_timeout as f64 - 1.0), "a slow connection was dropped before the read timeout: {drops:?}");
    assert_eq!(body_408, 10, "the body tricklers get 408: {statuses:?}");
    assert_eq!(inside, 0.0, "slow clients hold no admission ticket or slot");
}

/// A client that stops reading a stream: once the socket buffers are full and it has accepted
/// nothing for `--idle-timeout`, it is disconnected and its generation stopped.
fn stalled_reader(report: &mut Report) {
    let idle = 2;
    let srv = Server::start(&tiny(), &["--slots", "1", "-t", "2", "--idle-timeout", &idle.to_string()]);
    let before = srv.metrics()["minfer_connections_open"];
    // 20 alternatives per token make each event about 2 KB: 4000 of them overfill the buffers.
    let body = json!({"prompt": "hi", "max_tokens": 4000, "stream": true, "temperature": 0, "logprobs": 20});
    // A small receive buffer, so that the server's writes block soon after the client stops.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], srv.port)).into()).unwrap();
    let mut s: std::net::TcpStream = sock.into();
    use std::io::Write;
    s.write_all(&http::request_bytes("POST", "/v1/completions", &[("Content-Type", "application/json")], body.to_string().as_bytes())).unwrap();
    let t0 = Instant::now();
    let mut m = srv.metrics();
    while t0.elapsed() < Duration::from_secs(90) && (m["minfer_cancelled_total"] < 1.0 || m["minfer_slots_busy"] > 0.0) {
        std::thread::sleep(Duration::from_millis(250));
        m = srv.metrics();
    }
    let secs = t0.elapsed().as_secs_f64();
    // The server closed its side: the connection count is back (the metrics request's own
    // connection is counted in both readings), and the client reads the end of the stream.
    // A closed connection is counted off by its task on the runtime, a moment after the slot
    // saw the client go (and so is the previous metrics request's): wait for it, up to 5 s.
    let mut open = srv.metrics()["minfer_connections_open"];
    let t1 = Instant::now();
    while open != before && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        open = srv.metrics()["minfer_connections_open"];
    }
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    let closed = std::io::Read::read_to_end(&mut s, &mut sink).is_ok() || sink.is_empty();
    report.say(format!(
        "| stalled reader | a stream whose client never reads, --idle-timeout {idle} s | stopped after {} of 4000 tokens, {secs:.1} s after the request | connections open: {before} before, {open} after | slot free, cancelled {} |",
        m["minfer_generated_tokens_total"], m["minfer_cancelled_total"]
    ));
    assert_eq!(m["minfer_cancelled_total"], 1.0, "the stalled stream's generation is cancelled: {m:?}");
    assert!(m["minfer_generated_tokens_total"] < 4000.0, "{m:?}");
    assert_eq!(m["minfer_slots_busy"], 0.0);
    assert_eq!(open, before, "the stalled connection is closed");
    assert!(closed, "the stalled connection ends (EOF or reset) once the client reads again");
}

/// Hostile bodies: each a 4xx in the OpenAI error shape, memory bounded, the server serving.
fn floods(report: &mut Report) {
    let srv = Server::start(&tiny(), &["--slots", "2", "-t", "2"]);
    let port = srv.port;
    let rss_before = srv.peak_rss_mib();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let deep = format!("{{\"prompt\": {}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let bias: serde_json::Map<String, Json> = (0..200_000).map(|i| (i.to_string(), json!(1))).collect();
    let stops: Vec<String> = (0..100_000).map(|i| format!("s{i}")).collect();
    let long_prompt = "word ".repeat(200_000);
    let cases: Vec<(&str, &str, Vec<u8>, &str, u16)> = vec![
        ("oversized body (9 MiB)", "/v1/completions", format!("{{\"prompt\": \"{}\"}}", "x".repeat(9 << 20)).into_bytes(), "application/json", 413),
        ("JSON nested 10^5 deep", "/v1/completions", deep.into_bytes(), "application/json", 400),
        ("n = 10^6", "/v1/chat/completions", json!({"messages": msgs, "n": 1_000_000}).to_string().into_bytes(), "application/json", 400),
        ("max_tokens = 10^12", "/v1/completions", json!({"prompt": "x", "max_tokens": 1_000_000_000_000u64}).to_string().into_bytes(), "application/json", 400),
        ("max_tokens past the context", "/v1/completions", json!({"prompt": "x", "max_tokens": 1_000_000}).to_string().into_bytes(), "application/json", 400),
        ("prompt past the context (200k words)", "/v1/completions", json!({"prompt": long_prompt}).to_string().into_bytes(), "application/json", 400),
        ("logit_bias with 200k entries", "/v1/chat/completions", json!({"messages": msgs, "logit_bias": bias}).to_string().into_bytes(), "application/json", 400),
        ("stop list of 10^5 strings", "/v1/chat/completions", json!({"messages": msgs, "stop": stops}).to_string().into_bytes(), "application/json", 400),
        ("invalid UTF-8", "/v1/completions", b"{\"prompt\": \"\xff\xfe\"}".to_vec(), "application/json", 400),
        ("text/plain body", "/v1/completions", b"{\"prompt\": \"x\"}".to_vec(), "text/plain", 415),
        ("form body", "/v1/completions", b"prompt=x".to_vec(), "application/x-www-form-urlencoded", 415),
        ("GBNF grammar with an undefined rule", "/v1/chat/completions", json!({"messages": msgs, "grammar": "root ::= \"a\" missing"}).to_string().into_bytes(), "application/json", 400),
        ("json_schema with a keyword it cannot enforce", "/v1/completions", json!({"prompt": "x", "json_schema": {"type": "array", "uniqueItems": true}}).to_string().into_bytes(), "application/json", 400),
        ("not an object", "/v1/completions", b"[1, 2, 3]".to_vec(), "application/json", 400),
    ];
    let mut rows = Vec::new();
    for (name, path, body, ctype, want) in &cases {
        let t0 = Instant::now();
        let r = request(port, "POST", path, &[("Content-Type", ctype)], body, T).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let v = r.json();
        let e = &v["error"];
        assert_eq!(r.status, *want, "{name}: {v}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty() && !m.contains('\n') && m.len() < 400), "{name}: {v}");
        assert!(e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(), "{name}: {v}");
        rows.push(format!("{name}: {} in {ms:.0} ms", r.status));
    }
    // A megabyte of headers: hyper refuses it before any handler (431, no body).
    let big_header = "a".repeat(1 << 20);
    let r = request(port, "GET", "/health", &[("X-Big", &big_header)], b"", T).map(|r| r.status).unwrap_or(0);
    assert!(r == 431 || r == 0, "a 1 MiB header: {r}");
    rows.push(format!("1 MiB header: {}", if r == 0 { "connection closed".to_string() } else { r.to_string() }));
    // The same floods from 16 clients at once, 4 rounds.
    let cases = Arc::new(cases);
    let threads: Vec<_> = (0..16)
        .map(|k| {
            let cases = cases.clone();
            std::thread::spawn(move || {
                for round in 0..4 {
                    let (_, path, body, ctype, want) = &cases[(k + round) % cases.len()];
                    let r = request(port, "POST", path, &[("Content-Type", ctype)], body, T).unwrap();
                    assert_eq!(r.status, *want);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a flood client failed");
    }
    let ok = post_json(port, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 4, "temperature": 0}), T).unwrap();
    assert_eq!(ok.status, 200, "still serving after the floods");
    let rss = srv.peak_rss_mib();
    report.say(format!("| floods | {} | peak RSS {rss:.0} MiB (at start {rss_before:.0}) | still serving: yes |", rows.join("; ")));
    assert!(rss < rss_before + 512.0, "peak RSS grew from {rss_before} to {rss} MiB");
}

/// SIGTERM while 8 streams run over 4 slots: short ones finish, the rest end with
/// finish_reason "shutdown" (or a 503 when still queued), /health says draining, exit code 0.
fn restart_under_load(report: &mut Report) {
    let drain = 6;
    let mut srv = Server::start(&tiny(), &["--slots", "4", "-t", "2", "--drain-timeout", &drain.to_string()]);
    let port = srv.port;
    let results = Arc::new(Mutex::new(Vec::new()));
    let start = |i: usize| {
        let results = results.clone();
        std::thread::spawn(move || {
            // Two short ones (they finish within the drain), six that cannot.
            let max_tokens = if i < 2 { 120 } else { 3500 };
            let body = json!({"prompt": format!("Story {i}:"), "max_tokens": max_tokens, "temperature": 0, "stream": true});
            let r = stream(port, "/v1/completions", &body, None, Duration::from_secs(30));
            results.lock().unwrap().push((i, r, Instant::now()));
        })
    };
    let busy = |n: f64| {
        let t0 = Instant::now();
        while srv.metrics()["minfer_slots_busy"] < n && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // The short ones take slots first, then the long ones fill the rest and the queue.
    let mut handles: Vec<_> = (0..2).map(start).collect();
    busy(2.0);
    handles.extend((2..8).map(start));
    busy(4.0);
    let signalled = Instant::now();
    srv.sigterm();
    std::thread::sleep(Duration::from_millis(300));
    let health = request(port, "GET", "/health", &[], b"", Duration::from_secs(5)).expect("/health while draining");
    let refused = post_json(port, "/v1/completions", &json!({"prompt": "x", "max_tokens": 2}), Duration::from_secs(5)).expect("a request while draining");
    let code = srv.wait_exit(Duration::from_secs(drain + 10)).expect("the server did not exit");
    let exit_secs = signalled.elapsed().as_secs_f64();
    for h in handles {
        h.join().unwrap();
    }
    let results = results.lock().unwrap();
    let (mut finished, mut finished_in_drain, mut shut, mut refused_queued) = (0, 0, 0, 0);
    for (i, r, ended) in results.iter() {
        let s = r.as_ref().unwrap_or_else(|e| panic!("stream {i} failed: {e}"));
        match (s.status, s.finish_reason.as_deref()) {
            (200, Some("length")) if s.done => {
                finished += 1;
                finished_in_drain += usize::from(*ended > signalled);
            }
            (200, Some("shutdown")) => {
                assert!(s.error.as_ref().is_some_and(|e| e["error"]["code"] == "server_shutting_down"), "{s:?}");
                shut += 1;
            }
            (503, _) => refused_queued += 1,
            _ => panic!("stream {i}: {s:?}"),
        }
    }
    report.say(format!(
        "| restart under load | SIGTERM with 8 streams on 4 slots, --drain-timeout {drain} s | {finished} finished ({finished_in_drain} of them after the signal), {shut} ended with finish_reason \"shutdown\" + error event, {refused_queued} queued answered 503 | /health while draining: {} {} | new request while draining: {} | exit {:?} after {exit_secs:.1} s |",
        health.status,
        health.json()["status"],
        refused.status,
        code.code(),
    ));
    assert_eq!(code.code(), Some(0));
    assert_eq!((finished, finished_in_drain), (2, 2), "the short streams finish during the drain");
    assert_eq!(finished + shut + refused_queued, 8);
    assert!(shut >= 2, "the long streams are ended by the drain timeout");
    assert_eq!((health.status, health.json()["status"].as_str()), (503, Some("draining")));
    assert_eq!(refused.status, 503);
    assert!(exit_secs < drain as f64 + 5.0, "exit took {exit_secs} s");
}

#[test]
fn server_reliability_suite() {
    let mut report = Report::default();
    report.say("| test | what | requests | errors | latency | memory | state after |");
    report.say("|---|---|---|---|---|---|---|");
    let t0 = Instant::now();
    load(&mut report);
    slowloris(&mut report);
    stalled_reader(&mut report);
    floods(&mut report);
    restart_under_load(&mut report);
    report.say(format!("suite: {:.0} s", t0.elapsed().as_secs_f64()));
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("report.md"), report.lines.join("\n") + "\n").unwrap();
}
