//! What the project's code asks of Stripe, by resource and access: the permissions a restricted
//! key needs, and the harmless request that shows whether a key has each (`payctl preflight`).
//! A unit test holds [`USES`] to every path this module's siblings request.

/// Read or write access to a resource, as a restricted key grants it (write includes read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// `GET` requests.
    Read,
    /// `POST` and `DELETE` requests.
    Write,
}

/// One request the code makes.
#[derive(Debug, Clone, Copy)]
pub struct Use {
    /// `GET`, `POST` or `DELETE`.
    pub method: &'static str,
    /// The path, an object's id written `{id}`.
    pub path: &'static str,
    /// The resource a restricted key names (the path's first segment).
    pub resource: &'static str,
    /// What the request needs of it.
    pub access: Access,
    /// Who makes it: `processors` (the functions), `connect`, `smoke` (test keys only).
    pub by: &'static str,
}

const fn u(
    method: &'static str,
    path: &'static str,
    resource: &'static str,
    access: Access,
    by: &'static str,
) -> Use {
    Use {
        method,
        path,
        resource,
        access,
        by,
    }
}

/// Every request the code makes of Stripe.
pub const USES: &[Use] = &[
    u(
        "POST",
        "/v1/payment_intents",
        "payment_intents",
        Access::Write,
        "processors",
    ),
    u(
        "GET",
        "/v1/payment_intents",
        "payment_intents",
        Access::Read,
        "processors",
    ),
    u(
        "GET",
        "/v1/payment_intents/search",
        "payment_intents",
        Access::Read,
        "processors",
    ),
    u(
        "GET",
        "/v1/payment_intents/{id}",
        "payment_intents",
        Access::Read,
        "processors",
    ),
    u(
        "POST",
        "/v1/refunds",
        "refunds",
        Access::Write,
        "processors",
    ),
    u("GET", "/v1/refunds", "refunds", Access::Read, "processors"),
    u(
        "GET",
        "/v1/refunds/{id}",
        "refunds",
        Access::Read,
        "processors",
    ),
    u(
        "GET",
        "/v1/charges/{id}",
        "charges",
        Access::Read,
        "processors",
    ),
    u(
        "GET",
        "/v1/disputes/{id}",
        "disputes",
        Access::Read,
        "processors",
    ),
    u("GET", "/v1/events", "events", Access::Read, "processors"),
    u(
        "GET",
        "/v1/events/{id}",
        "events",
        Access::Read,
        "processors",
    ),
    u(
        "GET",
        "/v1/webhook_endpoints",
        "webhook_endpoints",
        Access::Read,
        "processors",
    ),
    u(
        "POST",
        "/v1/webhook_endpoints",
        "webhook_endpoints",
        Access::Write,
        "connect",
    ),
    u(
        "POST",
        "/v1/webhook_endpoints/{id}",
        "webhook_endpoints",
        Access::Write,
        "connect",
    ),
    u(
        "DELETE",
        "/v1/webhook_endpoints/{id}",
        "webhook_endpoints",
        Access::Write,
        "connect",
    ),
    u("POST", "/v1/customers", "customers", Access::Write, "smoke"),
];

/// A harmless request that needs `access` to `resource`: a `GET` of one item of its list, or a
/// `POST` of an empty form, which Stripe refuses (`400`, a parameter missing) after it checked
/// the key and before anything is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The resource.
    pub resource: &'static str,
    /// The access it shows.
    pub access: Access,
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The path (a read asks for one item: `limit=1`).
    pub path: String,
}

impl crate::stripe::StripeClient {
    /// Sends `probe` (a write's under the idempotency key `key`, which Stripe keeps nothing
    /// for: the request is refused before it runs): the answer's status and body.
    pub async fn probe(
        &self,
        probe: &Probe,
        key: &str,
    ) -> Result<(u16, String), crate::provider::ProviderError> {
        let (status, _, body) = match probe.access {
            Access::Read => self.get(&probe.path, &[("limit", "1")]).await?,
            Access::Write => self.post_form(&probe.path, key, &[]).await?,
        };
        Ok((status.as_u16(), body))
    }
}

/// The probes of what the uses made `by` any of `by` need: one per resource and access.
pub fn probes(by: &[&str]) -> Vec<Probe> {
    let mut needed: Vec<(&'static str, Access)> = USES
        .iter()
        .filter(|u| by.contains(&u.by))
        .map(|u| (u.resource, u.access))
        .collect();
    needed.sort();
    needed.dedup();
    needed
        .into_iter()
        .map(|(resource, access)| match access {
            Access::Read => Probe {
                resource,
                access,
                method: "GET",
                path: format!("/v1/{resource}"),
            },
            Access::Write => Probe {
                resource,
                access,
                method: "POST",
                path: format!("/v1/{resource}"),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `"/v1/...` literals of a source file's code (its tests left out), each object id
    /// written `{id}` and any query cut.
    fn paths_in(source: &str) -> Vec<String> {
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        let mut found = Vec::new();
        for piece in code.split("\"/v1/").skip(1) {
            let literal = piece.split('"').next().unwrap_or_default();
            let path = format!("/v1/{}", literal.split('?').next().unwrap_or_default());
            let normal: Vec<String> = path
                .split('/')
                .map(|seg| {
                    if seg.starts_with('{') {
                        "{id}".to_owned()
                    } else {
                        seg.to_owned()
                    }
                })
                .collect();
            found.push(normal.join("/"));
        }
        found
    }

    #[test]
    fn every_path_the_client_requests_is_a_use_with_its_permission() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/stripe");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            // The events route this system serves, not a request to Stripe; and the probes,
            // built from USES itself.
            if let Some("receiver.rs" | "permissions.rs") =
                path.file_name().and_then(|n| n.to_str())
            {
                continue;
            }
            for p in paths_in(&std::fs::read_to_string(&path).unwrap()) {
                seen += 1;
                assert!(
                    USES.iter().any(|u| u.path == p),
                    "{} requests {p}, which USES does not list (add it with the permission it needs)",
                    path.display()
                );
            }
        }
        assert!(seen >= 12, "only {seen} paths found: the scan is broken");
        for u in USES {
            assert_eq!(u.path.split('/').nth(2), Some(u.resource), "{u:?}");
            let write = u.method != "GET";
            assert_eq!(write, u.access == Access::Write, "{u:?}");
        }
    }

    #[test]
    fn one_probe_per_resource_and_access_the_processors_need() {
        let found = probes(&["processors"]);
        let shown: Vec<(&str, &str)> = found.iter().map(|p| (p.method, p.path.as_str())).collect();
        assert_eq!(
            shown,
            vec![
                ("GET", "/v1/charges"),
                ("GET", "/v1/disputes"),
                ("GET", "/v1/events"),
                ("GET", "/v1/payment_intents"),
                ("POST", "/v1/payment_intents"),
                ("GET", "/v1/refunds"),
                ("POST", "/v1/refunds"),
                ("GET", "/v1/webhook_endpoints"),
            ]
        );
        assert!(probes(&["processors", "connect"])
            .iter()
            .any(|p| p.method == "POST" && p.path == "/v1/webhook_endpoints"));
    }
}
