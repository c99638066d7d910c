//! `kvctl member list | add-learner | promote | remove`: the membership
//! after the change, as a table or JSON; `kvctl member move-leader`: who
//! led and who leads now.

use kvclient::kvproto::cluster::v1 as cpb;
use serde_json::{Value, json};

use super::Context;
use crate::cli::MemberCommand;
use crate::exit::Failure;
use crate::output::Printer;

fn members_output(printer: &Printer, members: &[cpb::Member]) {
    if printer.json() {
        let list: Vec<Value> = members
            .iter()
            .map(|m| {
                json!({
                    "id": m.id,
                    "client_addr": m.client_addr,
                    "peer_addr": m.peer_addr,
                    "voter": m.voter,
                })
            })
            .collect();
        printer.print_json(&json!({ "members": list }));
        return;
    }
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.client_addr.clone(),
                m.peer_addr.clone(),
                if m.voter { "voter" } else { "learner" }.to_string(),
            ]
        })
        .collect();
    printer.print_table(&["id", "client address", "peer address", "kind"], &rows);
}

/// `kvctl member move-leader ID`: etcdctl's message shape, with member ids.
async fn move_leader(context: &Context, client: &kvclient::Client, id: u64) -> Result<(), Failure> {
    let moved = client
        .move_leader(id)
        .await
        .map_err(|err| context.fail(err))?;
    let from = moved.header.map(|h| h.member_id).unwrap_or(0);
    if context.printer.json() {
        context
            .printer
            .print_json(&json!({ "from": from, "to": moved.leader_id }));
    } else if from == moved.leader_id {
        println!("member {from} already leads");
    } else {
        println!(
            "leadership moved from member {from} to member {}",
            moved.leader_id
        );
    }
    Ok(())
}

/// `kvctl member ...`.
pub async fn run(context: &Context, command: MemberCommand) -> Result<(), Failure> {
    let client = context.client()?;
    let removed = match command {
        MemberCommand::Remove { id } => Some(id),
        _ => None,
    };
    let members = match command {
        MemberCommand::MoveLeader { id } => return move_leader(context, &client, id).await,
        MemberCommand::List => client.members().await,
        MemberCommand::AddLearner {
            id,
            client_addr,
            peer_addr,
            wait,
        } => client.add_learner(id, &client_addr, &peer_addr, wait).await,
        MemberCommand::Promote { id } => client.promote(id).await,
        MemberCommand::Remove { id } => client.remove_member(id).await,
    }
    .map_err(|err| context.fail(err))?;
    members_output(&context.printer, &members);
    if let Some(id) = removed {
        // The removed member keeps running (and, if it missed its removal,
        // keeps asking for votes) until someone stops it.
        eprintln!("member {id} is out of the cluster; stop its process now");
    }
    Ok(())
}
