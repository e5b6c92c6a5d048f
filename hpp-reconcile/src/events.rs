//! Events that reach the cluster under any RBAC: `events.k8s.io/v1` first (kube's [`Recorder`],
//! with series and de-duplication), and core/v1 Events once that API is forbidden. An admin who
//! swaps KubeVirt's images keeps KubeVirt's roles, which grant only core `events`; hpp's own
//! roles grant both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::info;

/// Namespace of Events about cluster-scoped objects (as kube's Recorder does).
const CLUSTER_EVENTS_NAMESPACE: &str = "default";

/// Records Events, falling back to core/v1 when `events.k8s.io` is forbidden.
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
    client: Client,
    reporter: Reporter,
    core_only: Arc<AtomicBool>,
}

impl EventRecorder {
    /// A recorder for `reporter` (controller name and instance).
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            core_only: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a 403 on `events.k8s.io` switched this recorder to core/v1 Events.
    pub fn uses_core_events(&self) -> bool {
        self.core_only.load(Ordering::Relaxed)
    }

    /// Publishes `event` about `regarding`.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        if !self.uses_core_events() {
            match self.recorder.publish(event, regarding).await {
                Err(kube::Error::Api(status)) if status.is_forbidden() => {
                    info!(
                        controller = %self.reporter.controller,
                        "events.k8s.io Events are forbidden (RBAC grants core events only); recording core/v1 Events"
                    );
                    self.core_only.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        self.publish_core(event, regarding).await
    }

    async fn publish_core(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let namespace = regarding
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| CLUSTER_EVENTS_NAMESPACE.to_owned());
        let now = Time(Timestamp::now());
        let core = CoreEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", regarding.name.as_deref().unwrap_or("hpp"))),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: regarding.clone(),
            reason: Some(event.reason.clone()),
            message: event.note.clone(),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            action: Some(event.action.clone()),
            source: Some(EventSource {
                component: Some(self.reporter.controller.clone()),
                host: None,
            }),
            reporting_component: Some(self.reporter.controller.clone()),
            reporting_instance: self.reporter.instance.clone(),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..CoreEvent::default()
        };
        Api::<CoreEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &core)
            .await
            .map(|_| ())
    }
}
