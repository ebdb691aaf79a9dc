//! What a processing decides beyond the hooks: the introspection rules' [`Effect`]s folded into the hooks' [`Plan`]
//! (node patches and capabilities), and what stays for the engine to do (traits, `reset_interfaces`, a `fail`).

use crate::processing::Plan;
use crate::rules::Effect;

/// What the rules want beyond the node patch: traits, `reset_interfaces`, and a `fail` action's message.
#[derive(Debug, Default)]
pub struct RuleOutcome {
    pub traits_add: Vec<String>,
    pub traits_remove: Vec<String>,
    pub reset_interfaces: Option<bool>,
    pub failed: Option<String>,
}

/// Folds the rules' effects into the plan, in order, up to the first `fail` (ironic-inspector stops there: the
/// actions before it took effect, the ones after it do not).
pub fn fold_effects(effects: Vec<Effect>, plan: &mut Plan) -> RuleOutcome {
    let mut out = RuleOutcome::default();
    for e in effects {
        match e {
            Effect::Fail(msg) => {
                out.failed = Some(msg);
                break;
            }
            Effect::NodePatch { op, path, value } => plan.set_node(&op, &path, Some(value)),
            Effect::ResetInterfaces(r) => out.reset_interfaces = Some(r),
            Effect::Capability { name, value } => plan.merge_capabilities([(name, value)]),
            Effect::AddTrait(t) => {
                out.traits_remove.retain(|x| x != &t);
                out.traits_add.push(t);
            }
            Effect::RemoveTrait(t) => {
                out.traits_add.retain(|x| x != &t);
                out.traits_remove.push(t);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::processing::NodeView;

    #[test]
    fn rule_effects_fold_into_the_plan() {
        let node = NodeView { uuid: "n".into(), ..Default::default() };
        let mut plan = Plan::new();
        let out = fold_effects(
            vec![
                Effect::NodePatch { op: "add".into(), path: "/extra/rack".into(), value: json!("r1") },
                Effect::Capability { name: "gpu".into(), value: Some("true".into()) },
                Effect::AddTrait("CUSTOM_A".into()),
                Effect::RemoveTrait("CUSTOM_A".into()),
                Effect::AddTrait("CUSTOM_B".into()),
                Effect::Fail("no good".into()),
                Effect::AddTrait("CUSTOM_AFTER_FAIL".into()),
                Effect::Fail("second".into()),
            ],
            &mut plan,
        );
        assert_eq!(out.failed.as_deref(), Some("no good"));
        assert_eq!(out.traits_add, ["CUSTOM_B"], "nothing after the first fail");
        assert_eq!(out.traits_remove, ["CUSTOM_A"]);
        let ops = plan.node_patch(&node);
        assert!(ops.iter().any(|o| o.path == "/extra/rack"));
        assert!(ops.iter().any(|o| o.path == "/properties/capabilities" && o.value == Some(json!("gpu:true"))));
    }
}
