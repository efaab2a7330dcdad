package gen_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	activationv1 "github.com/protosaga/saga/testdata/golden/shapes/activation/v1"
	"github.com/protosaga/saga/testdata/golden/shapes/activation/v1/activationv1test"
)

// activation is the decider of the golden shapes contract: a prepaid line
// needs no credit check, an existing customer no welcome pack.
type activation struct {
	activationv1.ActivationNoopFolds
}

func (activation) Start(_ context.Context, m *activationv1.ActivateLine) (*activationv1.ActivationData, error) {
	return &activationv1.ActivationData{OrderId: m.GetOrderId(), Msisdn: m.GetMsisdn(), Prepaid: m.GetPrepaid(),
		NewCustomer: m.GetNewCustomer()}, nil
}

func (activation) BuildValidateAddress(_ context.Context, d *activationv1.ActivationData) (*activationv1.ValidateAddress, error) {
	return &activationv1.ValidateAddress{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildReserveNumber(_ context.Context, d *activationv1.ActivationData) (*activationv1.ReserveNumber, error) {
	return &activationv1.ReserveNumber{OrderId: d.GetOrderId(), Msisdn: d.GetMsisdn()}, nil
}

func (activation) BuildReleaseNumber(_ context.Context, d *activationv1.ActivationData) (*activationv1.ReleaseNumber, error) {
	return &activationv1.ReleaseNumber{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildShipSim(_ context.Context, d *activationv1.ActivationData) (*activationv1.ShipSim, error) {
	return &activationv1.ShipSim{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildRecallSim(_ context.Context, d *activationv1.ActivationData) (*activationv1.RecallSim, error) {
	return &activationv1.RecallSim{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildProvisionLine(_ context.Context, d *activationv1.ActivationData) (*activationv1.ProvisionLine, error) {
	return &activationv1.ProvisionLine{OrderId: d.GetOrderId()}, nil
}

func (activation) BuildSendWelcomePack(_ context.Context, d *activationv1.ActivationData) (*activationv1.SendWelcomePack, error) {
	return &activationv1.SendWelcomePack{OrderId: d.GetOrderId()}, nil
}

func (activation) SkipCreditCheck(_ context.Context, d *activationv1.ActivationData) (bool, string, error) {
	if d.GetPrepaid() {
		return true, "prepaid line: no credit risk", nil
	}
	return false, "", nil
}

func (activation) SkipSendWelcomePack(_ context.Context, d *activationv1.ActivationData) (bool, string, error) {
	if !d.GetNewCustomer() {
		return true, "existing customer", nil
	}
	return false, "", nil
}

func (activation) OnCreditRejected(_ context.Context, d *activationv1.ActivationData, m *activationv1.CreditRejected) error {
	d.CreditOfficer = m.GetOfficer()
	return nil
}

// TestShapesGeneratedSaga runs the generated code of the golden shapes
// contract (check steps, an external check, conditional steps) in memory.
func TestShapesGeneratedSaga(t *testing.T) {
	t.Parallel()
	const id = "order-7"
	tests := []struct {
		name string
		run  func(t *testing.T, h *activationv1test.Activation)
	}{
		{"prepaid, existing customer: both conditional steps skipped", func(t *testing.T, h *activationv1test.Activation) {
			h.Begin(&activationv1.ActivateLine{OrderId: id, Prepaid: true})
			h.RequireState(activationv1.ActivationStateValidateAddress)
			h.Reply(&activationv1.AddressValid{OrderId: id})
			h.RequireState(activationv1.ActivationStatePrepare)
			require.Equal(t, id, h.SentReserveNumber().GetOrderId())
			require.Equal(t, id, h.SentShipSim().GetOrderId())
			h.Reply(&activationv1.SimShipped{OrderId: id})
			h.RequireState(activationv1.ActivationStatePrepare)
			h.Reply(&activationv1.NumberReserved{OrderId: id})
			h.RequireState(activationv1.ActivationStateProvisionLine)
			require.Contains(t, h.Last().Note, "skipped conditional step CreditCheck: prepaid line: no credit risk")
			h.Reply(&activationv1.LineProvisioned{OrderId: id})
			h.RequireState(activationv1.ActivationStateCompleted)
			require.Contains(t, h.Last().Note, "skipped conditional step SendWelcomePack: existing customer")
			require.Equal(t, []string{"CreditCheck", "SendWelcomePack"}, h.Instance().Progress.Skipped)
		}},
		{"postpaid, new customer: the credit officer approves", func(t *testing.T, h *activationv1test.Activation) {
			h.Begin(&activationv1.ActivateLine{OrderId: id, NewCustomer: true})
			h.Reply(&activationv1.AddressValid{OrderId: id})
			h.Reply(&activationv1.NumberReserved{OrderId: id})
			h.Reply(&activationv1.SimShipped{OrderId: id})
			h.RequireState(activationv1.ActivationStateCreditCheck)
			h.RequireSent()
			h.Reply(&activationv1.CreditApproved{OrderId: id, Officer: "ana"})
			h.RequireState(activationv1.ActivationStateProvisionLine)
			h.Reply(&activationv1.LineProvisioned{OrderId: id})
			h.RequireState(activationv1.ActivationStateSendWelcomePack)
			require.Equal(t, id, h.SentSendWelcomePack().GetOrderId())
			h.Reply(&activationv1.WelcomePackSent{OrderId: id})
			h.RequireState(activationv1.ActivationStateCompleted)
			require.Empty(t, h.Instance().Progress.Skipped)
		}},
		{"credit rejected: the group's members are recalled in reverse order, the checks need no undo", func(t *testing.T, h *activationv1test.Activation) {
			h.Begin(&activationv1.ActivateLine{OrderId: id})
			h.Reply(&activationv1.AddressValid{OrderId: id})
			h.Reply(&activationv1.NumberReserved{OrderId: id})
			h.Reply(&activationv1.SimShipped{OrderId: id})
			h.Reply(&activationv1.CreditRejected{OrderId: id, Officer: "bo"})
			h.RequireState(activationv1.ActivationStateCompensatingShipSim)
			require.Equal(t, id, h.SentRecallSim().GetOrderId())
			require.Equal(t, "bo", h.Data().GetCreditOfficer())
			h.Reply(&activationv1.SimRecalled{OrderId: id})
			h.RequireState(activationv1.ActivationStateCompensatingReserveNumber)
			h.Reply(&activationv1.NumberReleased{OrderId: id})
			h.RequireState(activationv1.ActivationStateFailed)
			require.Equal(t, []string{"ShipSim", "ReserveNumber"}, h.Instance().Progress.Compensated)
		}},
		{"the number is taken while the SIM ships: the SIM is recalled", func(t *testing.T, h *activationv1test.Activation) {
			h.Begin(&activationv1.ActivateLine{OrderId: id})
			h.Reply(&activationv1.AddressValid{OrderId: id})
			h.Reply(&activationv1.NumberTaken{OrderId: id})
			h.RequireState(activationv1.ActivationStateCompensatingShipSim)
			require.Equal(t, []string{"ShipSim"}, h.Instance().Progress.Stopped)
			h.Reply(&activationv1.SimRecalled{OrderId: id})
			h.RequireState(activationv1.ActivationStateFailed)
		}},
		{"invalid address: nothing ran that needs undoing", func(t *testing.T, h *activationv1test.Activation) {
			h.Begin(&activationv1.ActivateLine{OrderId: id})
			h.Reply(&activationv1.AddressInvalid{OrderId: id, Reason: "no such street"})
			h.RequireState(activationv1.ActivationStateFailed)
			h.RequireSent()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, activationv1test.NewActivation(t, activation{}))
		})
	}
}

// TestShapesDiagram: the generated Markdown marks conditional steps in the
// step table and in the state diagram.
func TestShapesDiagram(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot, "testdata", "golden", "shapes", "activation", "v1", "activation.saga.md"))
	require.NoError(t, err)
	md := string(b)
	require.Contains(t, md, "| CreditCheck | check, conditional (the decider may skip it) | waits for an external event |")
	require.Contains(t, md, "note right of CREDIT_CHECK : conditional, the decider may skip it")
	require.Contains(t, md, "PREPARE --> PROVISION_LINE : NumberReserved / ProvisionLine<br/>SimShipped / ProvisionLine")
	require.Contains(t, md, "| ShipSim | compensatable, in parallel group Prepare |")
	require.Contains(t, md, "        PREPARE_fork --> PREPARE_SHIP_SIM\n")
	require.Contains(t, md, "## Parallel groups")
}
