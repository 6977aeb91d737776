//! The stack: provisioning a local endpoint from the template, the operator's shell (`env`,
//! local or deployed), and connecting a deployed stack to the provider (`connect`).

use anyhow::{bail, Context, Result};
use clap::Args;
use payctl::template;
use std::path::PathBuf;

/// The options of `payctl provision`.
#[derive(Args)]
pub struct ProvisionArgs {
    /// The SAM template to read (default: template.yaml here or in a folder above).
    #[arg(long)]
    pub template: Option<PathBuf>,
    /// Prefix of every resource name.
    #[arg(long)]
    pub stack_name: String,
    /// Override the source queue's visibility timeout (seconds).
    #[arg(long)]
    pub visibility_timeout: Option<i32>,
    /// Template parameter, NAME=VALUE (repeatable).
    #[arg(long = "param")]
    pub params: Vec<String>,
    /// Allow creating resources in a real AWS account (no AWS_ENDPOINT_URL set). On AWS,
    /// deploy the stack with sam deploy instead.
    #[arg(long)]
    pub yes_real_aws: bool,
}

/// Runs `payctl provision`.
pub async fn provision(args: ProvisionArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let ProvisionArgs {
        template,
        stack_name,
        visibility_timeout,
        params,
        yes_real_aws,
    } = args;
    let local = std::env::var("AWS_ENDPOINT_URL").is_ok_and(|u| !u.contains("amazonaws.com"));
    if !local && !yes_real_aws {
        bail!(
            "provision would create queues and tables in the AWS account of your credentials ({}): set AWS_ENDPOINT_URL for a local emulator, deploy to AWS with sam deploy, or pass --yes-real-aws",
            payctl::aws::endpoint(sdk)
        );
    }
    let template = find_template(template)?;
    payctl::aws::announce(sdk, &format!("provisioning {stack_name}")).await;
    let mut parameters = std::collections::HashMap::new();
    for p in params {
        let (k, v) = p.split_once('=').context("--param takes NAME=VALUE")?;
        parameters.insert(k.to_owned(), v.to_owned());
    }
    let stack = template::provision(
        sdk,
        &template,
        &template::ProvisionOptions {
            stack_name,
            parameters,
            visibility_timeout,
            max_receive_count: None,
            fifo: false,
            read_only: false,
        },
    )
    .await?;
    for (resource, done) in &stack.report {
        payctl::say!("{done:<8} {resource}");
    }
    // A local run takes the provider from its own environment, not the template's default.
    let mut function_env = stack.function_env.clone();
    for var in ["PROVIDER_API_URL", "PAYMENT_API_KEY_SECRET_ARN"] {
        match std::env::var(var) {
            Ok(v) if local => {
                function_env.insert(var.to_owned(), v);
            }
            _ if local => {
                function_env.remove(var);
            }
            _ => {}
        }
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "queues": stack.queues, "tables": stack.tables, "function_env": function_env,
            "event_source": {"queue_url": stack.event_source.queue_url, "batch_size": stack.event_source.batch_size,
                "batching_window_seconds": stack.event_source.batching_window_seconds,
                "function_timeout_seconds": stack.event_source.function_timeout_seconds},
        }))?
    );
    Ok(())
}

/// The options of `payctl env`.
#[derive(Args)]
pub struct EnvArgs {
    /// The SAM template the stack was provisioned from (default: template.yaml here or in a
    /// folder above).
    #[arg(long)]
    pub template: Option<PathBuf>,
    /// The stack's name (as given to provision).
    #[arg(long)]
    pub stack_name: String,
}

/// The template to read: `--template` when given, else the first `template.yaml` in this
/// directory or above it (the repository's root from any folder inside it).
fn find_template(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(t) = given {
        return Ok(t);
    }
    let here = std::env::current_dir().context("reading the current directory")?;
    here.ancestors()
        .map(|d| d.join("template.yaml"))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "no template.yaml in {} or above it: pass --template PATH (the SAM template the stack was provisioned from)",
                here.display()
            )
        })
}

/// Variables a function has of its own, never exported for a shell that runs several.
const PER_FUNCTION: [&str; 4] = [
    "SOURCE_QUEUE_URL",
    "DEAD_LETTER_QUEUE_URL",
    "PROVIDER_API_URL",
    "PAYMENT_API_KEY_SECRET_ARN",
];

/// Runs `payctl env`: reads the stack, changes nothing.
pub async fn env(args: EnvArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let EnvArgs {
        template,
        stack_name,
    } = args;
    // A deployed stack: its outputs and parameters.
    if let Some(deployed) = payctl::deployed::Deployed::find(sdk, &stack_name).await? {
        for (k, v) in deployed.shell(sdk.region().map(|r| r.as_ref())) {
            println!("export {k}='{}'", v.replace('\'', "'\\''"));
        }
        return Ok(());
    }
    if std::env::var("AWS_ENDPOINT_URL").is_err() {
        bail!("no stack {stack_name} in CloudFormation (region {}): deploy it (sam deploy --stack-name {stack_name}) or pass --region", sdk.region().map(|r| r.to_string()).unwrap_or_default());
    }
    let template = find_template(template)?;
    let stack = template::provision(
        sdk,
        &template,
        &template::ProvisionOptions {
            stack_name,
            read_only: true,
            ..Default::default()
        },
    )
    .await?;
    let mut vars: Vec<(String, String)> = [
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "PROVIDER_API_URL",
        "PAYMENT_API_KEY",
        "WEBHOOK_SECRET",
    ]
    .iter()
    .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
    .collect();
    // The payment processor's settings as provisioned, then what the other functions add.
    let mut seen: std::collections::BTreeSet<String> =
        vars.iter().map(|(k, _)| k.clone()).collect();
    let processor = stack.function_env.clone();
    let others = stack
        .function_envs
        .iter()
        .filter(|(f, _)| f.as_str() != template::PROCESSOR)
        .map(|(_, e)| e.clone());
    for (i, env) in std::iter::once(processor).chain(others).enumerate() {
        for (k, v) in env {
            let own = PER_FUNCTION.contains(&k.as_str());
            if (i > 0 || k != "DEAD_LETTER_QUEUE_URL") && own || seen.contains(&k) {
                continue;
            }
            seen.insert(k.clone());
            vars.push((k, v));
        }
    }
    let mut add = |k: &str, v: String| {
        if seen.insert(k.to_owned()) {
            vars.push((k.to_owned(), v));
        }
    };
    add("PAYMENTS_QUEUE_URL", stack.event_source.queue_url.clone());
    add("PAYMENTS_TABLE", stack.payments_table()?.to_owned());
    if let Some(refunds) = stack.event_sources.get(template::REFUND_PROCESSOR) {
        add("REFUNDS_QUEUE_URL", refunds.queue_url.clone());
        add(
            "REFUNDS_DEAD_LETTER_QUEUE_URL",
            stack
                .var_of(template::REFUND_PROCESSOR, "DEAD_LETTER_QUEUE_URL")?
                .to_owned(),
        );
    }
    if stack.event_sources.contains_key(template::EVENT_PROCESSOR) {
        add(
            "PROVIDER_EVENTS_DEAD_LETTER_QUEUE_URL",
            stack
                .var_of(template::EVENT_PROCESSOR, "DEAD_LETTER_QUEUE_URL")?
                .to_owned(),
        );
    }
    // `payctl api serve`'s default address, unless this shell names the API.
    add(
        "PAYMENTS_API_URL",
        std::env::var("PAYMENTS_API_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into()),
    );
    for (k, v) in vars {
        println!("export {k}='{}'", v.replace('\'', "'\\''"));
    }
    Ok(())
}

/// The options of `payctl connect`.
#[derive(Args)]
pub struct ConnectArgs {
    /// The deployed stack (its CloudFormation name).
    #[arg(long)]
    pub stack_name: String,
    /// The secret holding the key to register the endpoint with (default: the stack's own,
    /// PaymentApiKeySecretArn): a restricted key of the functions then needs no Webhook
    /// Endpoints write.
    #[arg(long)]
    pub key_secret_arn: Option<String>,
    /// Register a new endpoint even when the stack's is fine, and delete the old one: how to
    /// rotate the signing secret (Stripe's Dashboard roll leaves the endpoint's fingerprint
    /// naming the old secret).
    #[arg(long)]
    pub replace: bool,
    /// Seconds to wait for the test event's record in the inbox (0: only its acceptance).
    #[arg(long, default_value_t = 120)]
    pub wait: u64,
}

/// Runs `payctl connect`.
pub async fn connect(args: ConnectArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let stack = payctl::deployed::Deployed::read(sdk, &args.stack_name).await?;
    payctl::connect::connect(
        sdk,
        &stack,
        &payctl::connect::ConnectOptions {
            key_secret_arn: args.key_secret_arn,
            replace: args.replace,
            wait: std::time::Duration::from_secs(args.wait),
        },
    )
    .await
}

/// The options of `payctl preflight`.
#[derive(Args)]
pub struct PreflightArgs {
    /// The deployed stack (its CloudFormation name).
    #[arg(long)]
    pub stack_name: String,
    /// The provider key's mode the stack must have: live or test (default: either).
    #[arg(long, value_parser = ["live", "test"])]
    pub mode: Option<String>,
}

/// Runs `payctl preflight`: exits 0 when every check is fine, 2 when one needs a person, 1 on
/// an error.
pub async fn preflight(args: PreflightArgs, sdk: &aws_config::SdkConfig) -> Result<()> {
    let stack = payctl::deployed::Deployed::read(sdk, &args.stack_name).await?;
    let live = args.mode.as_deref().map(|m| m == "live");
    let findings = payctl::preflight::run(sdk, &stack, live).await?;
    print!("{}", payctl::preflight::render(&findings));
    let fix = findings.iter().filter(|f| !f.ok).count();
    if fix > 0 {
        println!(
            "preflight: {fix} to fix before traffic (stack {})",
            stack.name
        );
        std::process::exit(2);
    }
    println!("preflight: ready for traffic (stack {})", stack.name);
    Ok(())
}
