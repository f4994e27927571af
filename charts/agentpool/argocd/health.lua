-- Argo CD health check for agentpool.io/AgentServingPool, from the conditions the operator writes.
-- Install: argocd-cm, key resource.customizations.health.agentpool.io_AgentServingPool (docs/operator.md).
hs = {}
local function condition(obj, kind)
  if obj.status ~= nil and obj.status.conditions ~= nil then
    for _, c in ipairs(obj.status.conditions) do
      if c.type == kind then
        return c
      end
    end
  end
  return nil
end

local generation = obj.metadata.generation
local observed = nil
if obj.status ~= nil then
  observed = obj.status.observedGeneration
end
local ready = condition(obj, "Ready")
local degraded = condition(obj, "Degraded")
local progressing = condition(obj, "Progressing")

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = degraded.reason .. ": " .. (degraded.message or "")
elseif observed == nil or (generation ~= nil and observed < generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to apply generation " .. tostring(generation)
elseif ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or ""
elseif progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = progressing.reason .. ": " .. (progressing.message or "")
else
  hs.status = "Progressing"
  hs.message = "not ready yet"
  if ready ~= nil then
    hs.message = ready.reason .. ": " .. (ready.message or "")
  end
end
return hs
