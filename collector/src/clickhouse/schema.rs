//! The ClickHouse tables: creation (and columns added to tables of the first layout),
//! retention, and what they hold on disk.
use super::columns;
use super::http::{quoted, Http};
use crate::rows::HOUR_NS;
use crate::store::{Footprint, StoreError, TableSize};

/// Partitions by day of the window's (or bucket's) start: retention drops whole old parts.
fn by_day(column: &str) -> String {
    format!("PARTITION BY toYYYYMMDD(toDateTime(intDiv({column}, 1000000000)))")
}

/// Every table's statement; `{t}` is the windows table's name.
fn statements(t: &str) -> Vec<String> {
    let samples_cols = columns::typed();
    let key = columns::KEY;
    let (values, sums) = (columns::list(), columns::sums_as());
    let mut v = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (id Int64, agent String, labels String, \
             start_ns UInt64, end_ns UInt64, bytes UInt64, body String, idem String DEFAULT '') \
             ENGINE = MergeTree() {} ORDER BY (start_ns, id)",
            by_day("start_ns")
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_samples (labelset UInt64, start_ns UInt64, \
             window Int64, {samples_cols}) ENGINE = MergeTree() {} \
             ORDER BY (labelset, start_ns, kind)",
            by_day("start_ns")
        ),
        // Sample rows wait here until their window is stored; then they are copied into
        // T_samples (whose materialized views feed the rollups) in one INSERT … SELECT.
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_staging (labelset UInt64, start_ns UInt64, \
             window Int64, {samples_cols}) ENGINE = MergeTree() {} ORDER BY window",
            by_day("start_ns")
        ),
        // Windows whose rows were copied (see `write`).
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_promoted (id Int64, start_ns UInt64) \
             ENGINE = ReplacingMergeTree() {} ORDER BY id",
            by_day("start_ns")
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_phase_stats (labelset UInt64, start_ns UInt64, \
             window Int64, phase UInt64, calls UInt64, wall_ns UInt64, wall_max_ns UInt64, \
             hist_idx Array(UInt32), hist_n Array(UInt64), cpu_ns UInt64, offcpu_ns UInt64, \
             gowait_ns UInt64, syscalls UInt64, syscall_ns UInt64, cost_names Array(String), \
             cost_values Array(UInt64), alloc_bytes UInt64, allocs UInt64, frees UInt64, \
             page_faults UInt64) ENGINE = MergeTree() {} ORDER BY (labelset, start_ns)",
            by_day("start_ns")
        ),
    ];
    for (suffix, len) in [("1m", 60_000_000_000u64), ("1h", HOUR_NS)] {
        v.push(format!(
            "CREATE TABLE IF NOT EXISTS {t}_samples_{suffix} (labelset UInt64, t UInt64, \
             {samples_cols}) ENGINE = SummingMergeTree(({values})) {} \
             ORDER BY (labelset, t, {key})",
            by_day("t")
        ));
        v.push(format!(
            "CREATE MATERIALIZED VIEW IF NOT EXISTS {t}_samples_{suffix}_mv TO {t}_samples_{suffix} \
             AS SELECT labelset, intDiv(start_ns, {len}) * {len} AS t, {key}, \
             {sums} FROM {t}_samples GROUP BY labelset, t, {key}"
        ));
    }
    for (name, cols) in [
        ("labelsets", "id UInt64, labels String"),
        ("functions", "id UInt64, name String"),
        ("mappings", "id UInt64, name String"),
        (
            "stacks",
            "id UInt64, functions Array(UInt64), mappings Array(UInt64), flags Array(UInt8)",
        ),
        ("phasesets", "id UInt64, phases Array(UInt64)"),
    ] {
        v.push(format!(
            "CREATE TABLE IF NOT EXISTS {t}_{name} ({cols}) \
             ENGINE = ReplacingMergeTree() ORDER BY id"
        ));
    }
    v
}

/// Columns the windows table gained with rows (18.16 has no ADD COLUMN IF NOT EXISTS).
const WINDOW_COLUMNS: &[(&str, &str)] = &[
    ("idem", "String DEFAULT ''"),
    ("labelset", "UInt64 DEFAULT 0"),
    ("events", "UInt8 DEFAULT 0"),
    ("head", "String DEFAULT ''"),
    ("counter_names", "Array(String)"),
    ("counter_values", "Array(UInt64)"),
    ("rows", "UInt64 DEFAULT 0"),
];

/// Columns the phase totals table gained after its first layout (appended: rows are written in
/// the table's column order).
const PHASE_STATS_COLUMNS: &[(&str, &str)] = &[("cpu_wait_ns", "UInt64 DEFAULT 0")];

/// Adds to `table` (made by an older collector) the columns of `columns` it lacks.
fn add_missing_columns(
    http: &Http,
    table: &str,
    columns: &[(&str, &str)],
) -> Result<(), StoreError> {
    for (name, ty) in columns {
        let has = http.number(&format!(
            "SELECT count() FROM system.columns WHERE database = currentDatabase() \
             AND table = {} AND name = {}",
            quoted(table),
            quoted(name)
        ))?;
        if has == 0 {
            http.run(&format!("ALTER TABLE {table} ADD COLUMN {name} {ty}"), None)?;
        }
    }
    Ok(())
}

pub fn create(http: &Http, t: &str) -> Result<(), StoreError> {
    // Tables of a layout before staging: every window listed has its samples in T_samples.
    let had_promoted = http.number(&format!(
        "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = {}",
        quoted(&format!("{t}_promoted"))
    ))? > 0;
    let mut made = statements(t).into_iter();
    if let Some(windows) = made.next() {
        http.run(&windows, None)?;
    }
    add_missing_columns(http, t, WINDOW_COLUMNS)?;
    for s in made {
        http.run(&s, None)?;
    }
    add_missing_columns(http, &format!("{t}_phase_stats"), PHASE_STATS_COLUMNS)?;
    if !had_promoted {
        http.run(
            &format!("INSERT INTO {t}_promoted SELECT id, start_ns FROM {t}"),
            None,
        )?;
    }
    Ok(())
}

/// Deletes the windows that started before the hour `before_ns` falls in, with their rows
/// and rollups (whole buckets: what rollups sum is always what the windows hold).
pub fn retain(http: &Http, t: &str, before_ns: u64) -> Result<usize, StoreError> {
    let cutoff = before_ns / HOUR_NS * HOUR_NS;
    let n = http.number(&format!(
        "SELECT count() FROM {t} WHERE start_ns < {cutoff}"
    ))?;
    if n > 0 {
        for (table, column) in [
            (t.to_string(), "start_ns"),
            (format!("{t}_samples"), "start_ns"),
            (format!("{t}_phase_stats"), "start_ns"),
            (format!("{t}_staging"), "start_ns"),
            (format!("{t}_promoted"), "start_ns"),
            (format!("{t}_samples_1m"), "t"),
            (format!("{t}_samples_1h"), "t"),
        ] {
            http.run(
                &format!("ALTER TABLE {table} DELETE WHERE {column} < {cutoff}"),
                None,
            )?;
        }
    }
    Ok(n as usize)
}

/// Rows and compressed bytes on disk per table (active parts), and the body column's.
pub fn footprint(http: &Http, t: &str) -> Result<Footprint, StoreError> {
    let ours = format!(
        "(table = {} OR table LIKE {})",
        quoted(t),
        quoted(&format!("{t}\\_%"))
    );
    let out = http.run(
        &format!(
            "SELECT table, sum(rows), sum(bytes_on_disk) FROM system.parts \
             WHERE active AND database = currentDatabase() AND {ours} \
             GROUP BY table ORDER BY table FORMAT TabSeparated"
        ),
        None,
    )?;
    let tables: Vec<TableSize> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some(TableSize {
                table: f.next()?.to_string(),
                rows: f.next()?.parse().ok()?,
                bytes: f.next()?.parse().ok()?,
            })
        })
        .collect();
    // The bodies as received (current releases keep no per-column sizes of compact parts in
    // system.columns).
    let body_bytes = http.number(&format!("SELECT sum(bytes) FROM {t}"))?;
    Ok(Footprint {
        total_bytes: tables.iter().map(|t| t.bytes).sum(),
        body_bytes,
        body_stored_bytes: None,
        tables,
    })
}
