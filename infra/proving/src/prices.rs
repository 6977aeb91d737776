//! AWS list prices the benchmark's cost table uses: one place to update them.
//!
//! Region us-east-1, on-demand, without free tiers, as AWS published them on 2025-01-01
//! (DynamoDB on-demand after its November 2024 reduction). Check the pricing pages of Lambda,
//! DynamoDB, SQS and CloudWatch before quoting a total, and change the date with the numbers.

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
