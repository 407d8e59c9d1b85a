//! Selections as profiles: the store's sums rebuilt into one profile (`rows::rebuild`), and
//! each window's sums digested for a diff.
use phaseprof_model::diff::RunDigest;
use phaseprof_model::Profile;

use crate::rows::rebuild;
use crate::store::{Selector, Store, StoreError};

/// Every window `sel` selects merged into one profile by the store; None if none matches.
pub fn merged_profile(store: &dyn Store, sel: &Selector) -> Result<Option<Profile>, StoreError> {
    let m = store.merged(sel)?;
    if m.agg.windows == 0 {
        return Ok(None);
    }
    Ok(Some(rebuild(&m.agg, &m.dict)))
}

/// Each selected window's digest for a diff, from its sums in the store.
pub fn digests(store: &dyn Store, sel: &Selector) -> Result<Vec<RunDigest>, StoreError> {
    let (aggs, dict) = store.per_window(sel)?;
    Ok(aggs
        .iter()
        .map(|a| RunDigest::of(&rebuild(a, &dict)))
        .collect())
}
