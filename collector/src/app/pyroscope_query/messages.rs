//! The messages of Pyroscope's query API that the collector serves, with the field numbers of
//! `querier/v1/querier.proto` and `types/v1/types.proto` in github.com/grafana/pyroscope/api
//! v1.6.0 (declared with prost's derive, so no protoc at build time).
#![allow(missing_docs)]
use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct ProfileTypesRequest {
    #[prost(int64, tag = "1")]
    pub start: i64,
    #[prost(int64, tag = "2")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProfileTypesResponse {
    #[prost(message, repeated, tag = "1")]
    pub profile_types: Vec<ProfileType>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProfileType {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub sample_type: String,
    #[prost(string, tag = "5")]
    pub sample_unit: String,
    #[prost(string, tag = "6")]
    pub period_type: String,
    #[prost(string, tag = "7")]
    pub period_unit: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct LabelNamesRequest {
    #[prost(string, repeated, tag = "1")]
    pub matchers: Vec<String>,
    #[prost(int64, tag = "2")]
    pub start: i64,
    #[prost(int64, tag = "3")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LabelNamesResponse {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LabelValuesRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "2")]
    pub matchers: Vec<String>,
    #[prost(int64, tag = "3")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LabelValuesResponse {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SeriesRequest {
    #[prost(string, repeated, tag = "1")]
    pub matchers: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub label_names: Vec<String>,
    #[prost(int64, tag = "3")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct SeriesResponse {
    #[prost(message, repeated, tag = "2")]
    pub labels_set: Vec<Labels>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Labels {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct SelectMergeStacktracesRequest {
    #[prost(string, tag = "1")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    pub end: i64,
    #[prost(int64, optional, tag = "5")]
    pub max_nodes: Option<i64>,
    /// 0 or 1: the flame graph; others are not served.
    #[prost(int32, tag = "6")]
    pub format: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct SelectMergeStacktracesResponse {
    #[prost(message, optional, tag = "1")]
    pub flamegraph: Option<FlameGraph>,
}

#[derive(Clone, PartialEq, Message)]
pub struct FlameGraph {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
    #[prost(message, repeated, tag = "2")]
    pub levels: Vec<Level>,
    #[prost(int64, tag = "3")]
    pub total: i64,
    #[prost(int64, tag = "4")]
    pub max_self: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Level {
    #[prost(int64, repeated, tag = "1")]
    pub values: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SelectMergeProfileRequest {
    #[prost(string, tag = "1")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    pub end: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct DiffRequest {
    #[prost(message, optional, tag = "1")]
    pub left: Option<SelectMergeStacktracesRequest>,
    #[prost(message, optional, tag = "2")]
    pub right: Option<SelectMergeStacktracesRequest>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DiffResponse {
    #[prost(message, optional, tag = "1")]
    pub flamegraph: Option<FlameGraphDiff>,
}

#[derive(Clone, PartialEq, Message)]
pub struct FlameGraphDiff {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
    #[prost(message, repeated, tag = "2")]
    pub levels: Vec<Level>,
    #[prost(int64, tag = "3")]
    pub total: i64,
    #[prost(int64, tag = "4")]
    pub max_self: i64,
    #[prost(int64, tag = "5")]
    pub left_ticks: i64,
    #[prost(int64, tag = "6")]
    pub right_ticks: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct SelectSeriesRequest {
    #[prost(string, tag = "1")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    pub end: i64,
    #[prost(string, repeated, tag = "5")]
    pub group_by: Vec<String>,
    /// Seconds.
    #[prost(double, tag = "6")]
    pub step: f64,
    /// 0: sum, 1: average (types.v1.TimeSeriesAggregationType).
    #[prost(int32, optional, tag = "7")]
    pub aggregation: Option<i32>,
    #[prost(int64, optional, tag = "9")]
    pub limit: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SelectSeriesResponse {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<Series>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Series {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub points: Vec<Point>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Point {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// ms since the epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}
