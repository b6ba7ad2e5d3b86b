// A certified OpenID provider (oidc-provider) for the single sign-on browser test. Usage:
// node provider.mjs PORT GATEWAY_URL ACCOUNTS_JSON CLIENT_SECRET. Anyone may sign in at its
// development login form with any password; their `groups` are read from ACCOUNTS_JSON
// ({"alice": ["llm-admins"]}) at every sign-in, so the test changes them between sign-ins.
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const [port, gateway, accounts, secret] = process.argv.slice(2);
const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    client_id: "sluice",
    client_secret: secret,
    redirect_uris: [`${gateway}/admin/oidc/callback`],
    grant_types: ["authorization_code"],
    response_types: ["code"],
  }],
  claims: { email: ["email", "email_verified"], groups: ["groups"] },
  scopes: ["openid", "email", "groups"],
  // The groups in the ID token itself (not only at the userinfo endpoint).
  conformIdTokenClaims: false,
  cookies: { keys: ["sso-browser-test-cookie-key"] },
  features: { devInteractions: { enabled: true } },
  findAccount: async (_ctx, id) => ({
    accountId: id,
    claims: async () => ({
      sub: id,
      email: `${id}@example.com`,
      // Sluice names a login by its email only where the provider verified it.
      email_verified: true,
      groups: JSON.parse(readFileSync(accounts, "utf8"))[id] ?? [],
    }),
  }),
});
provider.listen(Number(port), () => console.log(`oidc-provider listening on ${port}`));
