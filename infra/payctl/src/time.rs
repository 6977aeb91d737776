//! Times in operator output.

/// An epoch-ms time as UTC, `2026-12-01T05:57:19.489Z`, for people reading operator output.
pub fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms since 1970"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_reads_epoch_milliseconds() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc(1_796_102_405_123), "2026-12-01T05:20:05.123Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
