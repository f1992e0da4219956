//! The Helm chart (`deploy/charts/ztunnel-mesh`) as the tests use it: linted
//! and rendered by the pinned helm that `scripts/k8s-test-env.sh` builds
//! beside the API server, its objects read back as YAML, a verb taken out
//! of a role on purpose, and the containers' args and environment as the
//! chart writes them, for running a component as a process the way its pod
//! would.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_yaml_ng::Value;

use crate::kube::KubeApi;
use crate::skip::skip;

/// The chart's directory in this checkout.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/charts/ztunnel-mesh")
}

/// The Gateway API CRDs in the chart's `crds/` (which `helm install`
/// installs), or why not: `scripts/k8s-test-env.sh --chart-crds` writes
/// them there; they are not kept in the repository.
pub fn chart_gateway_api_crds() -> Result<(), String> {
    let gateways = chart_dir().join("crds/gateway.networking.k8s.io_gateways.yaml");
    if gateways.is_file() {
        Ok(())
    } else {
        Err(format!(
            "{} missing: run scripts/k8s-test-env.sh --chart-crds (scripts/test.sh does)",
            gateways.display()
        ))
    }
}

/// The pinned helm.
pub struct Helm {
    bin: PathBuf,
}

impl Helm {
    /// helm from the test environment's cache, or the reason to skip.
    pub fn find() -> Result<Helm, String> {
        let bin = KubeApi::binaries()?.join("helm");
        if !bin.is_file() {
            return Err(format!(
                "{} missing: run scripts/k8s-test-env.sh to build helm",
                bin.display()
            ));
        }
        Ok(Helm { bin })
    }

    /// As [`Helm::find`], skipping with the reason ([`crate::skip::skip`],
    /// a failure under `ZTUNNEL_NO_SKIPS`) where helm is missing.
    #[track_caller]
    pub fn find_or_skip() -> Option<Helm> {
        match Helm::find() {
            Ok(helm) => Some(helm),
            Err(reason) => {
                skip(reason);
                None
            }
        }
    }

    /// Runs helm with `args`; its stdout and stderr together, or an error
    /// with both.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new(&self.bin)
            .args(args)
            // No repository config, cache or plugins of the machine's user.
            .env(
                "HELM_CONFIG_HOME",
                std::env::temp_dir().join("ztunnel-helm-config"),
            )
            .env(
                "HELM_CACHE_HOME",
                std::env::temp_dir().join("ztunnel-helm-cache"),
            )
            .env(
                "HELM_DATA_HOME",
                std::env::temp_dir().join("ztunnel-helm-data"),
            )
            .output()
            .context("running helm")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if !output.status.success() {
            bail!("helm {}: {}", args.join(" "), text);
        }
        Ok(text)
    }

    /// `helm lint --strict` of the chart with `values` files; its output.
    pub fn lint(&self, values: &[&Path]) -> anyhow::Result<String> {
        let chart = chart_dir();
        let mut args = vec!["lint".to_owned(), "--strict".to_owned()];
        args.push(chart.display().to_string());
        for file in values {
            args.push(format!("--values={}", file.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run(&args)
    }

    /// `helm template` of the chart as release `release` in `namespace`,
    /// CRDs included, with `values` files; the rendered objects.
    pub fn template(
        &self,
        release: &str,
        namespace: &str,
        values: &[&Path],
    ) -> anyhow::Result<Rendered> {
        let chart = chart_dir();
        let mut args = vec![
            "template".to_owned(),
            release.to_owned(),
            chart.display().to_string(),
            format!("--namespace={namespace}"),
            "--include-crds".to_owned(),
        ];
        for file in values {
            args.push(format!("--values={}", file.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = Command::new(&self.bin)
            .args(&args)
            .output()
            .context("running helm")?;
        if !output.status.success() {
            bail!(
                "helm {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Rendered::parse(&String::from_utf8_lossy(&output.stdout))
    }
}

/// The objects a `helm template` rendered.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// Every non-empty document, in order.
    pub objects: Vec<Value>,
}

impl Rendered {
    /// Parses a multi-document YAML stream.
    pub fn parse(yaml: &str) -> anyhow::Result<Rendered> {
        use serde::Deserialize;
        let mut objects = Vec::new();
        for document in serde_yaml_ng::Deserializer::from_str(yaml) {
            let value = Value::deserialize(document).context("rendered YAML")?;
            if !value.is_null() {
                objects.push(value);
            }
        }
        Ok(Rendered { objects })
    }

    /// The objects as one YAML stream, for `kubectl apply -f -`.
    pub fn to_yaml(&self) -> anyhow::Result<String> {
        let mut out = String::new();
        for object in &self.objects {
            out.push_str("---\n");
            out.push_str(&serde_yaml_ng::to_string(object)?);
        }
        Ok(out)
    }

    /// `kind/name` of every object, as `kubectl` names them (lower-case
    /// kind, API group left out).
    pub fn names(&self) -> Vec<String> {
        self.objects
            .iter()
            .map(|object| format!("{}/{}", str_at(object, &["kind"]), name(object)))
            .collect()
    }

    /// The object of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> anyhow::Result<&Value> {
        self.objects
            .iter()
            .find(|object| str_at(object, &["kind"]) == kind && self::name(object) == name)
            .with_context(|| format!("the chart renders no {kind} {name}"))
    }

    fn get_mut(&mut self, kind: &str, name: &str) -> anyhow::Result<&mut Value> {
        self.objects
            .iter_mut()
            .find(|object| str_at(object, &["kind"]) == kind && self::name(object) == name)
            .with_context(|| format!("the chart renders no {kind} {name}"))
    }

    /// Takes `verb` out of every rule of the (Cluster)Role `kind`/`name`
    /// that grants it on `resource` (a rule left with no verb goes): a
    /// deliberately broken role, to show that a check of the chart's RBAC
    /// can fail.
    pub fn remove_verb(
        &mut self,
        kind: &str,
        name: &str,
        resource: &str,
        verb: &str,
    ) -> anyhow::Result<()> {
        let role = self.get_mut(kind, name)?;
        let rules = role
            .get_mut("rules")
            .and_then(Value::as_sequence_mut)
            .with_context(|| format!("{kind} {name} has no rules"))?;
        let mut removed = false;
        for rule in rules.iter_mut() {
            let grants_resource = rule
                .get("resources")
                .and_then(Value::as_sequence)
                .is_some_and(|list| list.iter().any(|item| item.as_str() == Some(resource)));
            if !grants_resource {
                continue;
            }
            if let Some(verbs) = rule.get_mut("verbs").and_then(Value::as_sequence_mut) {
                let before = verbs.len();
                verbs.retain(|item| item.as_str() != Some(verb));
                removed |= verbs.len() != before;
            }
        }
        if !removed {
            bail!("{kind} {name} grants no {verb} on {resource}");
        }
        // A rule left without verbs is invalid; it goes.
        rules.retain(|rule| {
            rule.get("verbs")
                .and_then(Value::as_sequence)
                .is_some_and(|verbs| !verbs.is_empty())
        });
        Ok(())
    }

    /// The container `container` of the workload `kind`/`name`: its args
    /// and the environment variables the chart sets with a literal value
    /// (those from the downward API are the caller's to supply).
    pub fn container(&self, kind: &str, name: &str, container: &str) -> anyhow::Result<Container> {
        let workload = self.get(kind, name)?;
        let containers = workload
            .get("spec")
            .and_then(|spec| spec.get("template"))
            .and_then(|template| template.get("spec"))
            .and_then(|spec| spec.get("containers"))
            .and_then(Value::as_sequence)
            .with_context(|| format!("{kind} {name} has no containers"))?;
        let found = containers
            .iter()
            .find(|item| str_at(item, &["name"]) == container)
            .with_context(|| format!("{kind} {name} has no container {container}"))?;
        let strings = |key: &str| -> Vec<String> {
            found
                .get(key)
                .and_then(Value::as_sequence)
                .map(|list| {
                    list.iter()
                        .filter_map(|item| item.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut env = Vec::new();
        if let Some(list) = found.get("env").and_then(Value::as_sequence) {
            for item in list {
                if let Some(value) = item.get("value").and_then(Value::as_str) {
                    env.push((str_at(item, &["name"]).to_owned(), value.to_owned()));
                }
            }
        }
        Ok(Container {
            command: strings("command"),
            args: strings("args"),
            env,
        })
    }
}

/// A container as the chart writes it.
#[derive(Debug, Clone)]
pub struct Container {
    /// The `command` list: which of our binaries the chart starts.
    pub command: Vec<String>,
    /// The `args` list: the flags a test passes to run the binary as the
    /// chart does.
    pub args: Vec<String>,
    /// Literal `env` entries, in order.
    pub env: Vec<(String, String)>,
}

impl Container {
    /// The args with each `--flag` or `--flag=value` in `replace` swapped
    /// for its replacement (an empty replacement drops it); fails when the
    /// chart does not pass one of them, so a renamed flag is noticed.
    pub fn args_replacing(&self, replace: &[(&str, &str)]) -> anyhow::Result<Vec<String>> {
        let mut args = self.args.clone();
        for (flag, replacement) in replace {
            let position = args
                .iter()
                .position(|arg| arg == flag || arg.starts_with(&format!("{flag}=")))
                .with_context(|| format!("the chart passes no {flag} (args {:?})", self.args))?;
            if replacement.is_empty() {
                args.remove(position);
            } else {
                args[position] = (*replacement).to_owned();
            }
        }
        Ok(args)
    }
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    let mut here = value;
    for key in path {
        match here.get(*key) {
            Some(next) => here = next,
            None => return "",
        }
    }
    here.as_str().unwrap_or("")
}

fn name(object: &Value) -> &str {
    str_at(object, &["metadata", "name"])
}

/// Lines of a component's log that show it was refused by the API server's
/// authorization: a `forbidden` answer, or the control plane's own report
/// of a permission its role lacks.
pub fn permission_problems(log: &str) -> Vec<String> {
    log.lines()
        .filter(|line| {
            let lower = line.to_ascii_lowercase();
            lower.contains("forbidden") || lower.contains("lacks permissions")
        })
        .map(str::to_owned)
        .collect()
}
