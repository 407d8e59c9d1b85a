//! Delivery off the recording thread: the session loop hands each window to a queue and goes
//! back to recording; a thread of its own posts it (10 s timeouts), spools it, retries the
//! spool. A hung collector or a slow or full disk then costs windows, counted in
//! `windows_dropped`, never the recording: the queue is bounded, and a window that finds it
//! full is dropped at once.
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use super::push::{PushMetrics, Sender};

/// Windows waiting for the delivery thread at most (a few minutes of 10-s windows: enough to
/// ride out a collector that answers slowly, bounded in memory).
const QUEUE: usize = 16;
/// How often the spool is retried when no window arrives.
const RETRY_EVERY: Duration = Duration::from_secs(1);

pub struct Delivery {
    queue: Option<SyncSender<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
    pub metrics: Arc<PushMetrics>,
}

impl Delivery {
    pub fn start(mut sender: Sender) -> Result<Self> {
        let metrics = sender.metrics.clone();
        let (queue, windows) = sync_channel::<Vec<u8>>(QUEUE);
        let counters = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("delivery".into())
            .spawn(move || {
                loop {
                    match windows.recv_timeout(RETRY_EVERY) {
                        Ok(body) => {
                            if let Err(e) = sender.submit(body) {
                                counters.windows_dropped.fetch_add(1, Ordering::Relaxed);
                                eprintln!("phaseprof: warning: a window is dropped: {e:#}");
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => sender.flush_spool(false),
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                sender.flush_spool(true);
            })
            .context("starting the delivery thread")?;
        Ok(Delivery {
            queue: Some(queue),
            thread: Some(thread),
            metrics,
        })
    }

    /// Hands a window over without waiting; dropped (and counted) when the queue is full.
    pub fn hand_over(&self, body: Vec<u8>) {
        let Some(queue) = &self.queue else { return };
        match queue.try_send(body) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.metrics.windows_dropped.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "phaseprof: warning: {QUEUE} windows wait for delivery already; this one is dropped"
                );
            }
            Err(TrySendError::Disconnected(_)) => {
                self.metrics.windows_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Delivers (or spools) what is queued, tries the spool once more, and stops the thread.
    pub fn finish(mut self) {
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
