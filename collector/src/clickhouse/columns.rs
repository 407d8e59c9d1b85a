//! The sample tables' columns, generated from the kinds' table (`phaseprof_model::kinds`): the
//! key, one UInt64 per stored value (`rows::VALUES` of them), and `fvalue`, a Float64 that only
//! rows of the first layout filled (an allocation's estimated count; 0 since). Every statement
//! that names them (tables, rollup views, reads) is built here.
use crate::rows::{value_column, VALUES};

/// What sample rows are summed by.
pub const KEY: &str = "kind, pid, phase, phaseset, stack, nr";

fn values() -> impl Iterator<Item = String> {
    (0..VALUES).map(value_column)
}

/// The columns of a sample table, with their types.
pub fn typed() -> String {
    let values: Vec<String> = values().map(|c| format!("{c} UInt64")).collect();
    format!(
        "kind UInt8, pid UInt32, phase UInt64, phaseset UInt64, stack UInt64, nr UInt32, {}, \
         fvalue Float64",
        values.join(", ")
    )
}

/// The value columns, comma-separated (`value, value2, …, fvalue`).
pub fn list() -> String {
    values()
        .chain(std::iter::once("fvalue".to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each value column summed under its own name (a rollup view's select).
pub fn sums_as() -> String {
    values()
        .chain(std::iter::once("fvalue".to_string()))
        .map(|c| format!("sum({c}) AS {c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each value column summed, saturating at 2^64−1 as merges do everywhere (ClickHouse's UInt64
/// `sum` wraps, and Debian's ClickHouse has no UInt128 to sum in): a Float64 sum tells when the
/// exact one wrapped. In `list()`'s order.
pub fn saturating_sums() -> String {
    values()
        .map(|c| {
            format!(
                "if(sum(toFloat64({c})) >= 18446744073709551615., 18446744073709551615, sum({c}))"
            )
        })
        .chain(std::iter::once("sum(fvalue)".to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the generated columns against the layout existing tables have (three values and
    // fvalue): a change here is a change of stored tables, which needs a migration.
    #[test]
    fn columns_are_the_stored_layout() {
        assert_eq!(list(), "value, value2, value3, fvalue");
        assert!(typed().ends_with("value UInt64, value2 UInt64, value3 UInt64, fvalue Float64"));
    }
}
