//! phaseprof-collector: receives windows from fleet agents (authenticated per agent, validated
//! whole before anything is stored), stores them behind the [`store::Store`] trait (SQLite embedded, or ClickHouse), and merges
//! them by label selector and time range.
pub mod app;
pub mod batch;
pub mod clickhouse;
pub mod merged;
pub mod pages;
pub mod rows;
pub mod sqlite;
pub mod store;
pub mod store_error;
pub mod tls;
pub mod tokens;

pub use app::{app, AppState};
