package temporalsaga

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/protosaga/saga/bench/internal/shop"
)

// run executes PlaceOrder in the SDK's test environment with every activity
// mocked: each records its name, and the one named fail returns a
// non-retryable error. It returns the calls in order and the workflow's
// error.
func run(t *testing.T, fail string) ([]string, error) {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	a := &Activities{}
	env.RegisterActivity(a)
	var calls []string
	for name, fn := range map[string]any{
		"ReserveInventory": a.ReserveInventory, "AuthorizePayment": a.AuthorizePayment,
		"ScheduleShipping": a.ScheduleShipping, "ApproveOrder": a.ApproveOrder,
		"ReleaseInventory": a.ReleaseInventory, "VoidPayment": a.VoidPayment, "CancelShipment": a.CancelShipment,
	} {
		var err error
		if name == fail {
			err = temporal.NewNonRetryableApplicationError(name+" refused", "Refused", nil)
		}
		env.OnActivity(fn, mock.Anything, mock.Anything).Run(func(mock.Arguments) { calls = append(calls, name) }).Return(err)
	}
	env.ExecuteWorkflow(PlaceOrder, shop.Order{OrderID: "o-1", Lines: []shop.Line{{ProductID: "p-0001", Quantity: 1}}})
	require.True(t, env.IsWorkflowCompleted())
	return calls, env.GetWorkflowError()
}

func TestPlaceOrderRunsTheFourSteps(t *testing.T) {
	calls, err := run(t, "")
	require.NoError(t, err)
	require.Equal(t, []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping", "ApproveOrder"}, calls)
}

func TestPlaceOrderCompensatesInReverseOrder(t *testing.T) {
	for _, tc := range []struct {
		fail string
		want []string
	}{
		{"ReserveInventory", []string{"ReserveInventory"}},
		{"AuthorizePayment", []string{"ReserveInventory", "AuthorizePayment", "ReleaseInventory"}},
		{"ApproveOrder", []string{"ReserveInventory", "AuthorizePayment", "ScheduleShipping", "ApproveOrder",
			"CancelShipment", "VoidPayment", "ReleaseInventory"}},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			calls, err := run(t, tc.fail)
			var appErr *temporal.ApplicationError
			require.True(t, errors.As(err, &appErr), "workflow error %v", err)
			require.Equal(t, tc.fail+" refused", appErr.Message())
			require.Equal(t, tc.want, calls)
		})
	}
}
