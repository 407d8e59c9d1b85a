//! Group commit: windows arriving together are written by one thread in one transaction
//! (SQLite) or one INSERT (ClickHouse), each sender answered once its batch committed. A batch
//! is what waited while the previous one was written, so batches grow with the load and the
//! store sees a few writes a second whatever the rate.
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::{Inserted, StoreError};

type Reply = mpsc::SyncSender<Result<Inserted, StoreError>>;

pub struct Batcher<T> {
    tx: Mutex<mpsc::Sender<(T, Reply)>>,
}

impl<T: Send + 'static> Batcher<T> {
    /// A thread `name` calling `write` with each batch (at most `max` items, at least
    /// `spacing` between two writes' starts); `write` returns one result per item, in order.
    pub fn spawn(
        name: &str,
        max: usize,
        spacing: Duration,
        mut write: impl FnMut(Vec<T>) -> Vec<Result<Inserted, StoreError>> + Send + 'static,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<(T, Reply)>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut last = Instant::now() - spacing;
                while let Ok(first) = rx.recv() {
                    let mut batch = vec![first];
                    let due = last + spacing;
                    while batch.len() < max {
                        let item = match due.checked_duration_since(Instant::now()) {
                            Some(left) => rx.recv_timeout(left).ok(),
                            None => rx.try_recv().ok(),
                        };
                        match item {
                            Some(item) => batch.push(item),
                            None => break,
                        }
                    }
                    last = Instant::now();
                    let (items, replies): (Vec<T>, Vec<Reply>) = batch.into_iter().unzip();
                    let n = items.len();
                    let mut results = write(items).into_iter();
                    for reply in replies {
                        let r = results.next().unwrap_or_else(|| {
                            Err(StoreError::Backend(format!("a batch of {n} lost a result")))
                        });
                        let _ = reply.send(r);
                    }
                }
            })
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(Batcher { tx: Mutex::new(tx) })
    }

    /// Queues `item` and waits until its batch is written.
    pub fn submit(&self, item: T) -> Result<Inserted, StoreError> {
        let gone = || StoreError::Backend("the store's writer thread is gone".into());
        let (tx, rx) = mpsc::sync_channel(1);
        (self.tx.lock().unwrap_or_else(|e| e.into_inner()))
            .send((item, tx))
            .map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}
