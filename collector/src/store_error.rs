//! How a store fails: below the stores and their row codecs, which both report it.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Backend(String),
    #[error("a stored window does not decode: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// The same error again (one batch's failure answers each of its windows).
    pub fn duplicate(&self) -> StoreError {
        match self {
            StoreError::Backend(s) => StoreError::Backend(s.clone()),
            StoreError::Corrupt(s) => StoreError::Corrupt(s.clone()),
        }
    }
}
