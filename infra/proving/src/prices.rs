//! AWS list prices the benchmark's cost table uses: one place to update them.
//!
//! Region us-east-1, on-demand, without free tiers, as AWS published them on 2025-01-01
//! (DynamoDB on-demand after its November 2024 reduction). Check the pricing pages of Lambda,
//! DynamoDB, SQS, CloudWatch, API Gateway, KMS, X-Ray, Secrets Manager and EventBridge before
//! quoting a total, and change the date with the numbers.

/// The date and region these prices are for, printed with the cost table.
pub const AS_OF: &str = "us-east-1 list prices as of 2025-01-01, no free tier";

/// Lambda on arm64 (Graviton), USD per GB-second of billed duration (first 7.5 billion GB-s
/// of a month).
pub const LAMBDA_ARM64_PER_GB_SECOND: f64 = 0.000_013_333_4;

/// Lambda requests (invocations), USD per million.
pub const LAMBDA_PER_MILLION_REQUESTS: f64 = 0.20;

/// DynamoDB on demand, USD per million write request units (one per 1 KB of item written;
/// a refused conditional write still costs its units).
pub const DYNAMODB_PER_MILLION_WRITE_UNITS: f64 = 0.625;

/// DynamoDB on demand, USD per million read request units (one per 4 KB read strongly
/// consistently, half of that eventually consistently).
pub const DYNAMODB_PER_MILLION_READ_UNITS: f64 = 0.125;

/// SQS standard queue, USD per million requests (each 64 KB of a request counts as one; a
/// batch of ten messages is one request).
pub const SQS_PER_MILLION_REQUESTS: f64 = 0.40;

/// CloudWatch Logs, standard class, USD per GB ingested (10^9 bytes).
pub const CLOUDWATCH_LOGS_PER_GB: f64 = 0.50;

/// Bytes Lambda itself writes to the function's log per invocation (its `START`, `END` and
/// `REPORT` lines), on top of what the function prints.
pub const LAMBDA_PLATFORM_LOG_BYTES_PER_INVOCATION: f64 = 330.0;

/// API Gateway HTTP API, USD per million requests (first 300 million of a month; each 512 KB
/// of a request counts as one).
pub const HTTP_API_PER_MILLION_REQUESTS: f64 = 1.00;

/// DynamoDB standard table class, USD per GB-month of storage (item bytes plus 100 bytes of
/// overhead each, indexes included).
pub const DYNAMODB_STORAGE_PER_GB_MONTH: f64 = 0.25;

/// DynamoDB continuous backups (point-in-time recovery), USD per GB-month of table size.
pub const DYNAMODB_PITR_PER_GB_MONTH: f64 = 0.20;

/// Bytes DynamoDB adds to each stored item (and to each item an index projects).
pub const DYNAMODB_ITEM_OVERHEAD_BYTES: f64 = 100.0;

/// CloudWatch Logs storage (archived, compressed), USD per GB-month.
pub const CLOUDWATCH_LOGS_STORAGE_PER_GB_MONTH: f64 = 0.03;

/// X-Ray, USD per million traces recorded. Lambda's active tracing samples the first request
/// of each second and 5 % of the others (X-Ray's default rule).
pub const XRAY_PER_MILLION_TRACES: f64 = 5.00;
/// The share of invocations X-Ray's default rule records beyond its one a second.
pub const XRAY_DEFAULT_SAMPLED: f64 = 0.05;

/// KMS, USD per customer-managed key-month and per 10,000 requests.
pub const KMS_PER_KEY_MONTH: f64 = 1.00;
pub const KMS_PER_10K_REQUESTS: f64 = 0.03;

/// CloudWatch, USD per standard-resolution alarm-month, per dashboard-month (beyond the
/// account's first three) and per custom metric-month (first 10,000).
pub const CLOUDWATCH_PER_ALARM_MONTH: f64 = 0.10;
pub const CLOUDWATCH_PER_DASHBOARD_MONTH: f64 = 3.00;
pub const CLOUDWATCH_PER_CUSTOM_METRIC_MONTH: f64 = 0.30;

/// Secrets Manager, USD per secret-month and per 10,000 API calls.
pub const SECRETS_MANAGER_PER_SECRET_MONTH: f64 = 0.40;
pub const SECRETS_MANAGER_PER_10K_CALLS: f64 = 0.05;

/// EventBridge, USD per million events a partner (Stripe) puts on the bus; scheduled rules
/// and AWS services' own events are free.
pub const EVENTBRIDGE_PER_MILLION_PARTNER_EVENTS: f64 = 1.00;
