//! Server-sent events for `"stream": true`: one `data: {chunk}` frame per piece of text, a
//! last chunk with the `finish_reason`, the usage chunk when asked for, then `data: [DONE]`.
//! An error after the stream has started is sent as a `data: {"error": ...}` frame (the
//! status line is already out), and the stream ends.
//!
//! When the client goes away, the body stream is dropped with the event receiver, and the
//! slot sees the closed channel before its next forward pass. When the server's drain times
//! out, the stream ends with a chunk whose `finish_reason` is `"shutdown"` and an error event.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde_json::Value as Json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::lifecycle::Lifecycle;
use super::response::{Logprobs, Meta};
use super::slot::Event;
use super::tools::ToolCallSplitter;
use crate::tokenizer::Tokenizer;

/// What a stream shows besides the tokens.
pub struct StreamOptions {
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// Text sent before the completion (completions' `echo`).
    pub prefix: String,
    /// Tools were offered: `<tool_call>` blocks become tool calls.
    pub tools: bool,
    /// llama-server's `timings_per_token`: each chunk carries the timings so far.
    pub timings_per_token: bool,
}

/// OpenAI's chunks (chat and completions) for a [`FrameStream`].
pub struct OpenAiFrames {
    tok: Arc<Tokenizer>,
    meta: Meta,
    include_usage: bool,
    timings_per_token: bool,
    frames: VecDeque<Bytes>,
    /// The chat stream's first chunk carries the role.
    role_sent: bool,
    /// Bytes of text sent so far (completions' `text_offset`).
    offset: usize,
    /// When the request offered tools: holds back `<tool_call>` blocks.
    tools: Option<ToolCallSplitter>,
    ended: bool,
}

/// A streamed response whose frames a [`FrameMaker`] makes from the generation's events.
pub type EventStream = FrameStream<OpenAiFrames>;

/// Turns a generation's events into the frames of one API's stream.
pub trait FrameMaker: Send + 'static {
    /// Frames for `ev` appended to `out`; true when the stream has ended with it.
    fn make(&mut self, ev: Event, out: &mut VecDeque<Bytes>) -> bool;
}

/// A stream of frames: the events of `rx` (until the drain times out: `shut`) through `maker`.
pub struct FrameStream<M> {
    rx: UnboundedReceiver<Event>,
    shut: ShutSignal,
    frames: VecDeque<Bytes>,
    ended: bool,
    maker: M,
}

impl<M: FrameMaker> FrameStream<M> {
    pub fn with(rx: UnboundedReceiver<Event>, shut: ShutSignal, maker: M) -> FrameStream<M> {
        FrameStream { rx, shut, frames: VecDeque::new(), ended: false, maker }
    }

    /// Turns one event into frames (nothing after the end).
    pub fn push(&mut self, ev: Event) {
        if !self.ended {
            self.ended = self.maker.make(ev, &mut self.frames);
        }
    }

    async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.frames.pop_front() {
                return Some(b);
            }
            if self.ended {
                return None;
            }
            let ev = next_or_failed(&mut self.shut, &mut self.rx).await;
            self.push(ev);
        }
    }

    /// The response: `content_type` (`text/event-stream`, `application/x-ndjson`), the frames
    /// as they come.
    pub fn into_response_as(self, content_type: &'static str) -> Response {
        stream_response(self, |s| Box::pin(s.next_frame()), content_type)
    }
}

/// How a response learns that the server's drain timed out.
pub struct ShutSignal {
    shut: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// `--drain-timeout`, for the error.
    drain_secs: u64,
}

impl ShutSignal {
    pub fn new(lifecycle: &Lifecycle, drain_secs: u64) -> ShutSignal {
        ShutSignal { shut: Box::pin(lifecycle.until_shut()), drain_secs }
    }

    /// The generation's next event (`None`: its channel closed), or `ShutDown` once the drain
    /// has timed out.
    pub async fn next_event(&mut self, rx: &mut UnboundedReceiver<Event>) -> Result<Option<Event>, ApiError> {
        tokio::select! {
            ev = rx.recv() => Ok(ev),
            _ = &mut self.shut => Err(ApiError::ShutDown { secs: self.drain_secs }),
        }
    }
}

/// The generation's next event; its end without a result, or the drain's time-out, as a failure.
pub async fn next_or_failed(shut: &mut ShutSignal, rx: &mut UnboundedReceiver<Event>) -> Event {
    match shut.next_event(rx).await {
        Ok(Some(ev)) => ev,
        Ok(None) => Event::Failed(ApiError::Internal("the generation ended without a result".into())),
        Err(e) => Event::Failed(e),
    }
}

/// A generation's first event, or its failure as an error: nothing has been sent yet, so a
/// failure in prefill is a plain error response rather than a stream.
pub async fn first_event(shut: &mut ShutSignal, rx: &mut UnboundedReceiver<Event>) -> Result<Event, ApiError> {
    match next_or_failed(shut, rx).await {
        Event::Failed(e) => Err(e),
        ev => Ok(ev),
    }
}

/// A stream's next frame, boxed (`None`: the stream has ended).
pub type NextFrame<'a> = Pin<Box<dyn Future<Output = Option<Bytes>> + Send + 'a>>;

/// A streamed response of `content_type` whose pieces `next` draws from `state`.
pub fn stream_response<S: Send + 'static>(state: S, next: for<'a> fn(&'a mut S) -> NextFrame<'a>, content_type: &'static str) -> Response {
    let body = futures_util::stream::unfold(state, move |mut s| async move {
        let b = next(&mut s).await;
        b.map(|b| (Ok::<_, Infallible>(b), s))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn frame(v: &Json) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl FrameStream<OpenAiFrames> {
    /// A stream of `rx`'s events in OpenAI's chunks.
    pub fn new(rx: UnboundedReceiver<Event>, tok: Arc<Tokenizer>, meta: Meta, opts: StreamOptions, shut: ShutSignal) -> EventStream {
        let StreamOptions { include_usage, prefix, tools, timings_per_token } = opts;
        let tools = tools.then(ToolCallSplitter::default);
        let mut m = OpenAiFrames {
            tok,
            meta,
            include_usage,
            timings_per_token,
            frames: VecDeque::new(),
            role_sent: false,
            offset: 0,
            tools,
            ended: false,
        };
        let prefix = prefix.as_str();
        if !prefix.is_empty() {
            m.text_frame(prefix, None, None);
        }
        let mut s = FrameStream::with(rx, shut, m);
        s.frames.append(&mut s.maker.frames);
        s
    }

    pub fn into_response(self) -> Response {
        self.into_response_as("text/event-stream")
    }
}

impl FrameMaker for OpenAiFrames {
    fn make(&mut self, ev: Event, out: &mut VecDeque<Bytes>) -> bool {
        self.push(ev);
        out.append(&mut self.frames);
        self.ended
    }
}

impl OpenAiFrames {

    /// A chunk of text; a chat stream's first chunk, before it, names the role alone.
    fn text_frame(&mut self, text: &str, logprobs: Option<Json>, so_far: Option<&super::slot::Usage>) {
        self.role_frame();
        let mut chunk = self.meta.chunk(text, logprobs, self.include_usage);
        if let Some(u) = so_far.filter(|_| self.timings_per_token) {
            chunk["timings"] = super::response::timings(u);
        }
        self.frames.push_back(frame(&chunk));
        self.offset += text.len();
    }

    fn role_frame(&mut self) {
        if self.meta.api == super::response::Api::Chat && !self.role_sent {
            self.role_sent = true;
            self.frames.push_back(frame(&self.meta.role_chunk(self.include_usage)));
        }
    }

    /// Turns one event into frames.
    fn push(&mut self, ev: Event) {
        match ev {
            Event::Reply(_) => {}
            Event::Progress(p) => {
                self.role_frame();
                let mut chunk = self.meta.progress_chunk(self.include_usage);
                chunk["prompt_progress"] = super::native::progress_json(&p);
                if self.timings_per_token {
                    chunk["timings"] = super::response::timings(&p.so_far);
                }
                self.frames.push_back(frame(&chunk));
            }
            Event::Token(t) => {
                let mut lp = Logprobs::default();
                lp.push(&self.tok, &t);
                let logprobs = (!lp.is_empty()).then(|| lp.to_json(&self.tok, self.meta.api, self.offset));
                let text = match &mut self.tools {
                    Some(split) => split.push(&t.text),
                    None => t.text,
                };
                if !text.is_empty() || logprobs.is_some() {
                    self.text_frame(&text, logprobs, Some(&t.so_far));
                }
            }
            Event::Done(f) => {
                let (tail, calls) = self.tools.as_mut().map(ToolCallSplitter::finish).unwrap_or_default();
                self.role_frame();
                if !tail.is_empty() {
                    self.text_frame(&tail, None, None);
                }
                if !calls.is_empty() {
                    self.frames.push_back(frame(&self.meta.tool_calls_chunk(&calls, self.include_usage)));
                }
                self.frames.push_back(frame(&self.meta.final_chunk(&f, &calls, self.include_usage)));
                if self.include_usage {
                    self.frames.push_back(frame(&self.meta.usage_chunk(&f)));
                }
                self.frames.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.ended = true;
            }
            Event::Failed(e) => {
                if matches!(e, ApiError::ShutDown { .. }) {
                    self.frames.push_back(frame(&self.meta.shutdown_chunk(self.include_usage)));
                }
                self.fail(e)
            }
        }
    }

    fn fail(&mut self, e: ApiError) {
        self.frames.push_back(frame(&e.to_json()));
        self.ended = true;
    }

}
