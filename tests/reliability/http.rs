//! A small blocking HTTP/1.1 client for the reliability suite: whole requests, server-sent
//! event streams read chunk by chunk (so a client can stop at any point), and a `minfer serve`
//! child process with its stderr and peak memory. Shared by two test files, each using a part.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> Json {
        serde_json::from_slice(&self.body).unwrap_or(Json::Null)
    }
}

pub fn connect(port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// The request's bytes; `Content-Length` from the body, `Connection: close`.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Status line and headers.
fn read_head(r: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.get(9..12).and_then(|s| s.parse().ok()).ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.trim_end().split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok((status, headers))
}

/// Reads a body: chunked pieces are handed to `piece` as they come; returns false when
/// `piece` asked to stop.
fn read_body(r: &mut impl BufRead, chunked: bool, piece: &mut dyn FnMut(&[u8]) -> bool) -> std::io::Result<bool> {
    if !chunked {
        let mut all = Vec::new();
        r.read_to_end(&mut all)?;
        return Ok(piece(&all));
    }
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the chunked body ended early"));
        }
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16).map_err(std::io::Error::other)?;
        if size == 0 {
            return Ok(true);
        }
        let mut buf = vec![0; size + 2];
        r.read_exact(&mut buf)?;
        if !piece(&buf[..size]) {
            return Ok(false);
        }
    }
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"))
}

/// One whole request.
pub fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> std::io::Result<Response> {
    let mut s = connect(port, timeout)?;
    // A server may answer (413) and close before the whole body is sent: the answer is still
    // read after a failed write.
    let sent = s.write_all(&request_bytes(method, path, headers, body));
    let mut r = BufReader::new(s);
    let (status, headers) = match (read_head(&mut r), sent) {
        (Ok(h), _) => h,
        (Err(_), Err(e)) | (Err(e), Ok(())) => return Err(e),
    };
    let mut body = Vec::new();
    read_body(&mut r, is_chunked(&headers), &mut |b| {
        body.extend_from_slice(b);
        true
    })?;
    Ok(Response { status, body })
}

pub fn post_json(port: u16, path: &str, body: &Json, timeout: Duration) -> std::io::Result<Response> {
    request(port, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes(), timeout)
}

/// What a streamed generation gave.
#[derive(Debug, Default)]
pub struct Streamed {
    pub status: u16,
    /// The text of every chunk, joined (chat deltas or completion texts).
    pub text: String,
    pub finish_reason: Option<String>,
    /// Data frames received.
    pub frames: usize,
    /// The stream's `data: {"error": ...}`, if any.
    pub error: Option<Json>,
    /// `data: [DONE]` arrived.
    pub done: bool,
    /// The body of a non-200 answer.
    pub refusal: Option<Json>,
}

/// Streams a generation request, stopping (dropping the connection) after `stop_after` data
/// frames when given.
pub fn stream(port: u16, path: &str, body: &Json, stop_after: Option<usize>, timeout: Duration) -> std::io::Result<Streamed> {
    let mut s = connect(port, timeout)?;
    s.write_all(&request_bytes("POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes()))?;
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r)?;
    let mut out = Streamed { status, ..Streamed::default() };
    let mut pending = Vec::new();
    let chunked = is_chunked(&headers);
    if status != 200 {
        let mut body = Vec::new();
        read_body(&mut r, chunked, &mut |b| {
            body.extend_from_slice(b);
            true
        })?;
        out.refusal = serde_json::from_slice(&body).ok();
        return Ok(out);
    }
    read_body(&mut r, chunked, &mut |b| {
        pending.extend_from_slice(b);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = pending.drain(..end + 2).collect();
            let Some(data) = frame.strip_prefix(b"data: ") else { continue };
            let data = &data[..data.len() - 2];
            out.frames += 1;
            if data == b"[DONE]" {
                out.done = true;
                continue;
            }
            let v: Json = serde_json::from_slice(data).unwrap_or(Json::Null);
            if v.get("error").is_some() {
                out.error = Some(v);
                continue;
            }
            let c = &v["choices"][0];
            if let Some(t) = c["delta"]["content"].as_str().or_else(|| c["text"].as_str()) {
                out.text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                out.finish_reason = Some(f.to_string());
            }
        }
        stop_after.is_none_or(|n| out.frames < n)
    })?;
    Ok(out)
}

/// A `minfer serve` process on a free port.
pub struct Server {
    pub child: Child,
    pub port: u16,
    lines: Receiver<String>,
    pub log: Vec<String>,
}

impl Server {
    pub fn start(model: &std::path::Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args(["serve", "-m", model.to_str().unwrap(), "--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start minfer serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut s = Server { child, port: 0, lines, log: Vec::new() };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            let Ok(line) = s.lines.recv_timeout(Duration::from_secs(60)) else { break };
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                s.port = rest.split(' ').next().unwrap().parse().unwrap();
            }
            let ready = line.contains(" ready: ");
            s.log.push(line);
            if ready {
                return s;
            }
        }
        panic!("the server did not get ready: {:?}", s.log);
    }

    /// Stderr lines so far.
    pub fn drain_log(&mut self) -> &[String] {
        while let Ok(l) = self.lines.try_recv() {
            self.log.push(l);
        }
        &self.log
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory (VmHWM) in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    }

    /// `/metrics` as name → value (labels kept in the name).
    pub fn metrics(&self) -> std::collections::BTreeMap<String, f64> {
        let r = request(self.port, "GET", "/metrics", &[], b"", Duration::from_secs(10)).expect("GET /metrics");
        String::from_utf8_lossy(&r.body)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?))))
            .collect()
    }

    pub fn sigterm(&self) {
        let status = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the process to end, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `p`-quantile (0..=1) of `xs` in the same unit.
pub fn quantile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}
