//! The service the etcd port does not serve yet: `Auth` (users and
//! roles). Each call answers UNIMPLEMENTED at once with a message naming
//! what is missing, so a client never waits; `AuthDisable` answers etcd's
//! "authentication is not enabled", which is what a client that checks
//! auth expects of a cluster without it.

use kvproto::etcd::etcdserverpb::auth_server::Auth;
use kvproto::etcd::etcdserverpb::*;
use tonic::{Request, Response, Status};

use super::EtcdFrontEnd;
use super::errors::{self, etcd_error};

fn auth_unserved(call: &str) -> Status {
    Status::unimplemented(format!(
        "Auth.{call} is not served by raftcask's etcd port: it has no users or roles \
         (authentication is not enabled; the client port's token, --auth-token-file, guards \
         the etcd port too)"
    ))
}

#[tonic::async_trait]
impl Auth for EtcdFrontEnd {
    async fn auth_disable(
        &self,
        _request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        Err(etcd_error(
            errors::AUTH_NOT_ENABLED,
            "raftcask's etcd port has no etcd authentication to disable",
        ))
    }

    async fn auth_enable(
        &self,
        _request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        Err(auth_unserved("AuthEnable"))
    }

    async fn authenticate(
        &self,
        _request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        Err(auth_unserved("Authenticate"))
    }

    async fn user_add(
        &self,
        _request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        Err(auth_unserved("UserAdd"))
    }

    async fn user_get(
        &self,
        _request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        Err(auth_unserved("UserGet"))
    }

    async fn user_list(
        &self,
        _request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        Err(auth_unserved("UserList"))
    }

    async fn user_delete(
        &self,
        _request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        Err(auth_unserved("UserDelete"))
    }

    async fn user_change_password(
        &self,
        _request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        Err(auth_unserved("UserChangePassword"))
    }

    async fn user_grant_role(
        &self,
        _request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        Err(auth_unserved("UserGrantRole"))
    }

    async fn user_revoke_role(
        &self,
        _request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        Err(auth_unserved("UserRevokeRole"))
    }

    async fn role_add(
        &self,
        _request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        Err(auth_unserved("RoleAdd"))
    }

    async fn role_get(
        &self,
        _request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        Err(auth_unserved("RoleGet"))
    }

    async fn role_list(
        &self,
        _request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        Err(auth_unserved("RoleList"))
    }

    async fn role_delete(
        &self,
        _request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        Err(auth_unserved("RoleDelete"))
    }

    async fn role_grant_permission(
        &self,
        _request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        Err(auth_unserved("RoleGrantPermission"))
    }

    async fn role_revoke_permission(
        &self,
        _request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        Err(auth_unserved("RoleRevokePermission"))
    }
}
