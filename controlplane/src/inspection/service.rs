//! The `Inspection` gRPC service.

use std::sync::Arc;

use ironguard_inspection::machine::State;
use ironguard_inspection::records::NodeRecord;
use ironguard_proto::v1::inspection_server::Inspection;
use ironguard_proto::v1::{
    ContinueRequest, ContinueResponse, DataRequest, DataResponse, DeleteRulesResponse, DropQuarantinedRequest,
    DropQuarantinedResponse, InspectionStatus, ListQuarantinedRequest, ListQuarantinedResponse, ListRequest,
    ListResponse, ListRulesRequest, ListRulesResponse, NodeRequest, QuarantinedRequest, RequestAccepted, Rule,
    RuleRequest, StartRequest, StartResponse,
};
use tonic::{Request, Response, Status};

use super::engine::{ApiError, Engine};
use super::process::StoredData;
use crate::store::inspections::Quarantined;

/// gRPC front of the engine.
#[derive(Debug)]
pub struct InspectionService {
    pub engine: Arc<Engine>,
    /// Every call is an operator's.
    pub authz: Arc<crate::authz::Authz>,
    /// Read again at the next scrape once this replica drops a quarantined request.
    pub store_gauges: Arc<crate::metrics::StoreGauges>,
}

/// What `ListQuarantined` quotes of a record's bytes, in characters.
pub const QUARANTINE_RAW_CHARS: usize = 4096;

/// Largest introspection document accepted by `Continue`.
pub const MAX_DATA_BYTES: usize = 2 << 20;

/// The gRPC status of an engine error. Its message is bounded (it can quote the caller's data, e.g. a ramdisk's
/// error text, and a gRPC message travels in a header: 1000 characters, at most 12 kB percent-encoded).
fn status(e: ApiError) -> Status {
    let msg = ironguard_inspection::clip(&e.to_string(), 1000);
    match &e {
        ApiError::UnknownNode(_) | ApiError::NoMatch(_) => Status::not_found(msg),
        ApiError::ProvisionState { .. }
        | ApiError::Maintenance(_)
        | ApiError::Illegal { .. }
        | ApiError::NoData(_)
        | ApiError::NoIronic => Status::failed_precondition(msg),
        ApiError::Lookup(ironguard_inspection::lookup::LookupError::NotFound(_)) => Status::not_found(msg),
        ApiError::Lookup(_) => Status::failed_precondition(msg),
        ApiError::BadData(_)
        | ApiError::PreProcessing(_)
        | ApiError::Discovery(_)
        | ApiError::BadRule(_)
        | ApiError::NoEvidence(_) => Status::invalid_argument(msg),
        ApiError::EvidencePending(_) => Status::unavailable(msg),
        ApiError::UnknownRule(_) => Status::not_found(msg),
        ApiError::RuleExists(_) => Status::already_exists(msg),
        ApiError::Ironic(_) => Status::unavailable(msg),
        ApiError::Store(_) => Status::internal(msg),
    }
}

fn to_pb(r: NodeRecord) -> InspectionStatus {
    InspectionStatus {
        node: r.uuid,
        state: r.state.to_string(),
        finished: matches!(r.state, State::Finished | State::Error),
        error: r.error.unwrap_or_default(),
        started_at_ms: r.started_at.unwrap_or(0),
        finished_at_ms: r.finished_at.unwrap_or(0),
        macs: r.macs.iter().map(|m| m.to_string()).collect(),
        manage_boot: r.manage_boot,
        updated_at_ms: r.updated_at,
    }
}

fn quarantined_pb(q: Quarantined) -> QuarantinedRequest {
    QuarantinedRequest {
        id: q.id,
        node: q.node,
        key: q.key,
        error: q.error,
        quarantined_at_ms: q.quarantined_at,
        raw_bytes: q.raw.len() as u64,
        raw: ironguard_inspection::clip(&q.raw, QUARANTINE_RAW_CHARS),
    }
}

fn node_arg(n: &str) -> Result<&str, Status> {
    if n.is_empty() || n.len() > 255 || n.contains('/') {
        return Err(Status::invalid_argument(format!(
            "{:?} is not a node UUID or name",
            ironguard_inspection::clip(n, 64)
        )));
    }
    Ok(n)
}

impl InspectionService {
    /// Inspections are keyed by UUID; a name is looked up in Ironic.
    async fn resolve(&self, node: &str) -> Result<String, Status> {
        let node = node_arg(node)?;
        if self.engine.store.get(node).await.map_err(|e| Status::internal(e.to_string()))?.is_some() {
            return Ok(node.to_string());
        }
        match &self.engine.ironic {
            Some(i) => match i.get_node(node).await {
                Ok(n) => Ok(n.uuid),
                Err(ironguard_ironic::IronicError::NotFound { .. }) => {
                    Err(Status::not_found(format!("node {node} is not known to Ironic")))
                }
                Err(e) => Err(Status::unavailable(e.to_string())),
            },
            None => Ok(node.to_string()),
        }
    }
}

#[tonic::async_trait]
impl Inspection for InspectionService {
    async fn start(&self, r: Request<StartRequest>) -> Result<Response<StartResponse>, Status> {
        self.authz.operator(&r, "Inspection.Start")?;
        let r = r.into_inner();
        let (rec, id) = self.engine.start(node_arg(&r.node)?, r.manage_boot, r.maintenance_ok).await.map_err(status)?;
        Ok(Response::new(StartResponse { node: rec.uuid, request_id: id }))
    }

    async fn get(&self, r: Request<NodeRequest>) -> Result<Response<InspectionStatus>, Status> {
        self.authz.operator(&r, "Inspection.Get")?;
        let node = self.resolve(&r.into_inner().node).await?;
        let rec = self
            .engine
            .status(&node)
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .ok_or_else(|| Status::not_found(format!("node {node} has never been inspected")))?;
        Ok(Response::new(to_pb(rec)))
    }

    async fn list(&self, r: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        self.authz.operator(&r, "Inspection.List")?;
        let r = r.into_inner();
        let size = match r.page_size {
            0 => 100,
            n => n.min(1000) as usize,
        };
        let states = r
            .states
            .iter()
            .map(|s| s.parse::<State>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(Status::invalid_argument)?;
        let mut all = self.engine.store.list().await.map_err(|e| Status::internal(e.to_string()))?;
        all.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        let items: Vec<NodeRecord> = all
            .into_iter()
            .filter(|rec| states.is_empty() || states.contains(&rec.state))
            .filter(|rec| r.page_token.is_empty() || rec.uuid > r.page_token)
            .take(size + 1)
            .collect();
        let more = items.len() > size;
        let page: Vec<NodeRecord> = items.into_iter().take(size).collect();
        let next = if more { page.last().map(|p| p.uuid.clone()).unwrap_or_default() } else { String::new() };
        let quarantined = self.engine.store.quarantine_count().await.map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(ListResponse {
            inspections: page.into_iter().map(to_pb).collect(),
            next_page_token: next,
            quarantined,
        }))
    }

    async fn abort(&self, r: Request<NodeRequest>) -> Result<Response<RequestAccepted>, Status> {
        self.authz.operator(&r, "Inspection.Abort")?;
        let node = self.resolve(&r.into_inner().node).await?;
        let id = self.engine.abort(&node).await.map_err(status)?;
        Ok(Response::new(RequestAccepted { request_id: id }))
    }

    async fn r#continue(&self, r: Request<ContinueRequest>) -> Result<Response<ContinueResponse>, Status> {
        self.authz.operator(&r, "Inspection.Continue")?;
        let r = r.into_inner();
        if r.data_json.len() > MAX_DATA_BYTES {
            return Err(Status::invalid_argument(format!(
                "introspection data is {} bytes; at most {MAX_DATA_BYTES}",
                r.data_json.len()
            )));
        }
        let data = ironguard_inspection::bounded::parse_callback(r.data_json.as_bytes(), Default::default())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let node_uuid = Some(r.node_uuid).filter(|u| !u.is_empty());
        let node = self
            .engine
            .continue_inspection(data, r.data_json.as_bytes(), node_uuid, super::engine::Poster::Operator)
            .await
            .map_err(status)?;
        Ok(Response::new(ContinueResponse { node }))
    }

    async fn reapply(&self, r: Request<NodeRequest>) -> Result<Response<RequestAccepted>, Status> {
        self.authz.operator(&r, "Inspection.Reapply")?;
        let node = self.resolve(&r.into_inner().node).await?;
        let id = self.engine.reapply(&node).await.map_err(status)?;
        Ok(Response::new(RequestAccepted { request_id: id }))
    }

    async fn get_data(&self, r: Request<DataRequest>) -> Result<Response<DataResponse>, Status> {
        self.authz.operator(&r, "Inspection.GetData")?;
        let r = r.into_inner();
        let node = self.resolve(&r.node).await?;
        let data = self
            .engine
            .store
            .get_data(&node)
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(StoredData::from_value)
            .ok_or_else(|| Status::not_found(format!("no introspection data stored for node {node}")))?;
        let data = if r.unprocessed { data.unprocessed } else { data.processed };
        Ok(Response::new(DataResponse { node, data_json: data.to_string() }))
    }

    async fn create_rule(&self, r: Request<Rule>) -> Result<Response<Rule>, Status> {
        self.authz.operator(&r, "Inspection.CreateRule")?;
        let body = r.into_inner().rule_json;
        if body.len() > crate::inspector_api::MAX_RULE_BYTES {
            return Err(Status::invalid_argument(format!(
                "a rule is at most {} bytes",
                crate::inspector_api::MAX_RULE_BYTES
            )));
        }
        let body: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| Status::invalid_argument(format!("the rule is not JSON: {e}")))?;
        let rule = self.engine.create_rule(&body).await.map_err(status)?;
        Ok(Response::new(Rule { rule_json: rule.full().to_string() }))
    }

    async fn list_rules(&self, r: Request<ListRulesRequest>) -> Result<Response<ListRulesResponse>, Status> {
        self.authz.operator(&r, "Inspection.ListRules")?;
        let rules = self.engine.list_rules().await.map_err(status)?;
        Ok(Response::new(ListRulesResponse {
            rules: rules.iter().map(|r| Rule { rule_json: r.full().to_string() }).collect(),
        }))
    }

    async fn get_rule(&self, r: Request<RuleRequest>) -> Result<Response<Rule>, Status> {
        self.authz.operator(&r, "Inspection.GetRule")?;
        let rule = self.engine.get_rule(&r.into_inner().uuid).await.map_err(status)?;
        Ok(Response::new(Rule { rule_json: rule.full().to_string() }))
    }

    async fn delete_rule(&self, r: Request<RuleRequest>) -> Result<Response<DeleteRulesResponse>, Status> {
        self.authz.operator(&r, "Inspection.DeleteRule")?;
        self.engine.delete_rule(&r.into_inner().uuid).await.map_err(status)?;
        Ok(Response::new(DeleteRulesResponse { deleted: 1 }))
    }

    async fn delete_all_rules(&self, r: Request<ListRulesRequest>) -> Result<Response<DeleteRulesResponse>, Status> {
        self.authz.operator(&r, "Inspection.DeleteAllRules")?;
        let deleted = self.engine.delete_all_rules().await.map_err(status)?;
        Ok(Response::new(DeleteRulesResponse { deleted: deleted as u32 }))
    }

    async fn list_quarantined(
        &self,
        r: Request<ListQuarantinedRequest>,
    ) -> Result<Response<ListQuarantinedResponse>, Status> {
        self.authz.operator(&r, "Inspection.ListQuarantined")?;
        let all = self.engine.store.quarantined().await.map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(ListQuarantinedResponse { requests: all.into_iter().map(quarantined_pb).collect() }))
    }

    async fn drop_quarantined(
        &self,
        r: Request<DropQuarantinedRequest>,
    ) -> Result<Response<DropQuarantinedResponse>, Status> {
        let operator = self.authz.operator(&r, "Inspection.DropQuarantined")?;
        let id = r.into_inner().id;
        if !self.engine.store.drop_quarantined(id).await.map_err(|e| Status::internal(e.to_string()))? {
            return Err(Status::not_found(format!("no quarantined request {id}")));
        }
        self.store_gauges.invalidate().await;
        tracing::info!(id, operator, "a quarantined request was dropped");
        Ok(Response::new(DropQuarantinedResponse {}))
    }
}
