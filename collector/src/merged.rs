//! Stored windows decoded and merged into one profile, as queries and pages need them.
use phaseprof_model::diff::RunDigest;
use phaseprof_model::merge::Merger;
use phaseprof_model::Profile;

use crate::store::StoreError;

pub fn decode(body: &[u8]) -> Result<Profile, StoreError> {
    phaseprof_model::read_profile(body).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Each body decoded and digested for a diff, on every core, one window per worker at a time:
/// only the digests are kept (a fleet's hour of windows, decoded at once, would not fit).
pub fn digest_bodies(bodies: &[Vec<u8>]) -> Result<Vec<RunDigest>, StoreError> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(bodies.len())
        .max(1);
    let parts: Vec<Result<Vec<RunDigest>, StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .chunks(bodies.len().div_ceil(workers).max(1))
            .map(|share| {
                scope.spawn(move || {
                    share
                        .iter()
                        .map(|b| Ok(RunDigest::of(&decode(b)?)))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(StoreError::Backend("a digest worker panicked".into())))
            })
            .collect()
    });
    let mut out = Vec::with_capacity(bodies.len());
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// `bodies` merged into one profile. Windows are decoded and folded in on every core, each
/// worker merging its share one window at a time (an hour of a fleet is thousands of windows:
/// never all decoded at once); the partial merges are merged last.
pub fn merge_bodies(bodies: &[Vec<u8>]) -> Result<Profile, StoreError> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(bodies.len())
        .max(1);
    let partials: Vec<Result<Profile, StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .chunks(bodies.len().div_ceil(workers).max(1))
            .map(|share| {
                scope.spawn(move || {
                    let mut m = Merger::default();
                    for b in share {
                        m.add(&decode(b)?);
                    }
                    Ok(m.finish())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(StoreError::Backend("a merge worker panicked".into())))
            })
            .collect()
    });
    let mut m = Merger::default();
    for p in partials {
        m.add(&p?);
    }
    Ok(m.finish())
}
