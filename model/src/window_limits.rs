//! What a profile read from an untrusted sender may hold (`read_profile_limited`, the
//! collector's ingest): a stack of at most `MAX_STACK_FRAMES` frames, and at most
//! `MAX_WINDOW_ITEMS` items in all (frames, stacks, frame references, samples, names, rows of
//! every table). The limits are checked as the JSON is decoded, so a window past one is refused
//! after at most that much work, whatever its size class: a 69 KB upload of one stack of 33
//! million frames stops at frame 1,025. Profiles read from files (`read_profile`) have no limit.
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, Error, SeqAccess, Visitor};
use serde::Deserialize;

/// Frames in one stack: the deepest a recorder walks is 256 (user and kernel halves of 127
/// each by frame pointers, 256 by tables), with inlined frames added by symbolization.
pub const MAX_STACK_FRAMES: usize = 1024;
/// Items in one window: every element of every list, frame references included. A 10 s window
/// of a busy 128-CPU host holds ~10^5.
pub const MAX_WINDOW_ITEMS: u64 = 2_000_000;

/// The most a list's declared length may set aside before its items arrive.
const PRESIZE_BYTES: usize = 1 << 20;

thread_local! {
    /// Items a limited read may still decode on this thread; None: no limit.
    static LEFT: Cell<Option<u64>> = const { Cell::new(None) };
    /// The limit the last limited read stopped at, if it did.
    static REFUSAL: Cell<Option<String>> = const { Cell::new(None) };
}

/// Why the last limited read on this thread stopped, if a limit stopped it.
pub fn take_refusal() -> Option<String> {
    REFUSAL.with(|r| r.take())
}

fn refuse<E: Error>(why: String) -> E {
    REFUSAL.with(|r| r.set(Some(why.clone())));
    E::custom(why)
}

/// Runs `f` with the window limits on (for a read of untrusted bytes on this thread).
pub fn limited<T>(f: impl FnOnce() -> T) -> T {
    REFUSAL.with(|r| r.set(None));
    let before = LEFT.with(|l| l.replace(Some(MAX_WINDOW_ITEMS)));
    let out = f();
    LEFT.with(|l| l.set(before));
    out
}

fn limiting() -> bool {
    LEFT.with(|l| l.get().is_some())
}

/// Takes one item from the budget; false once it is spent.
fn take_item() -> bool {
    LEFT.with(|l| match l.get() {
        None => true,
        Some(0) => false,
        Some(n) => {
            l.set(Some(n - 1));
            true
        }
    })
}

struct Bounded<T> {
    per_list: Option<usize>,
    what: &'static str,
    _t: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a list of {}", self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        // Sized from the length the encoding declares (MessagePack always does), within the
        // list's own limit and `PRESIZE_BYTES`: the declared length is the sender's word (only
        // a truncated body can overstate it), not memory to set aside. Growing from nothing
        // was a sixth of decoding.
        let room = PRESIZE_BYTES / std::mem::size_of::<T>().max(1);
        let declared = seq.size_hint().unwrap_or(0);
        let mut out = Vec::with_capacity(declared.min(room).min(self.per_list.unwrap_or(room)));
        while let Some(item) = seq.next_element()? {
            if self.per_list.is_some_and(|max| out.len() >= max) && limiting() {
                return Err(refuse(format!(
                    "more than {} {}",
                    self.per_list.unwrap_or_default(),
                    self.what
                )));
            }
            if !take_item() {
                return Err(refuse(format!(
                    "more than {MAX_WINDOW_ITEMS} items in one window (at the {})",
                    self.what
                )));
            }
            out.push(item);
        }
        Ok(out)
    }
}

/// `deserialize_with` for a list counted against the window's items.
pub fn items<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    d.deserialize_seq(Bounded {
        per_list: None,
        what: std::any::type_name::<T>()
            .rsplit("::")
            .next()
            .unwrap_or("items"),
        _t: PhantomData,
    })
}

/// `deserialize_with` for a stack's frames: at most `MAX_STACK_FRAMES`, counted as items too.
pub fn stack_frames<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    d.deserialize_seq(Bounded {
        per_list: Some(MAX_STACK_FRAMES),
        what: "frames in one stack",
        _t: PhantomData,
    })
}

/// `deserialize_with` for a sample's values: at most `kinds::MAX_VALUES`, counted as items.
pub fn sample_values<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    d.deserialize_seq(Bounded {
        per_list: Some(crate::kinds::MAX_VALUES),
        what: "values in one sample",
        _t: PhantomData,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct S {
        #[serde(deserialize_with = "stack_frames")]
        frames: Vec<u32>,
    }

    // Checks that a limited read refuses a stack past the frame limit as it decodes, and that
    // an unlimited read takes it.
    #[test]
    fn refuses_deep_stacks_only_when_limited() {
        let deep = format!(
            "{{\"frames\":[{}]}}",
            vec!["1"; MAX_STACK_FRAMES + 1].join(",")
        );
        let e = limited(|| serde_json::from_str::<S>(&deep).err().unwrap());
        assert!(e.to_string().contains("more than 1024 frames"), "{e}");
        assert_eq!(
            serde_json::from_str::<S>(&deep).unwrap().frames.len(),
            MAX_STACK_FRAMES + 1
        );
        let ok = format!("{{\"frames\":[{}]}}", ["1"; 10].join(","));
        assert_eq!(
            limited(|| serde_json::from_str::<S>(&ok).unwrap())
                .frames
                .len(),
            10
        );
    }
}
