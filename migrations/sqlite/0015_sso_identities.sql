-- Single sign-on (src/auth/oidc.rs): a login made at its first SSO sign-in is keyed by its
-- provider's issuer and subject, never by email; it has no password. A break-glass login
-- (`sluice admin create --break-glass`) may still sign in with its password when
-- `[oidc] password_login = false`.
ALTER TABLE admins ADD COLUMN oidc_issuer TEXT;
ALTER TABLE admins ADD COLUMN oidc_subject TEXT;
ALTER TABLE admins ADD COLUMN break_glass INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX admins_oidc_identity ON admins(oidc_issuer, oidc_subject)
    WHERE oidc_issuer IS NOT NULL;
